"""The native encoder (`bpe_native`, `_bytebpe.c`): it splits text as Hugging Face runs the Qwen2 / Llama-3
regex, on every code point, and gives tiktoken's ids, on generated and on real text; long pieces merge in
O(n log n); bad arguments raise instead of crashing."""

from __future__ import annotations

import random
import string
import unicodedata
from array import array
from dataclasses import dataclass
from itertools import chain

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Regex, pre_tokenizers
from tokenizers import normalizers as hf_normalizers

from bench import corpora
from node.pipeline import _bytebpe, bpe_native, nfc
from node.pipeline.tokenizer import Tokenizer

_SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
_BMP = [chr(c) for c in chain(range(0xD800), range(0xE000, 0x10000))]
_ASTRAL = [chr(c) for c in range(0x10000, 0x110000)]

# Characters of every class and the ones the regex names: contraction letters (and U+017F, which folds to
# 's'), \r \n and other white space, digits of several kinds, letters of several categories and scripts, a
# combining mark (neither letter nor number), punctuation, an emoji.
_ALPHABET = [
    *"aZsStTmMdDrRvVeElLxy'’ſ",
    *" \t\n\r\x0b\x0c\x85\xa0\u3000\u2028\u2029\u200b",
    *"0123456789٣²Ⅻ",
    *"é中ひ한ǅʰß",
    "\u0301",
    *'.,!?()-_/\\"#<>',
    "🎉",
]
_PIECES = ["'s", "'LL", "'Re", "'ve", " \n ", "\r\n", "   ", "1234567", "don't", "  \t"]
_texts = st.lists(st.sampled_from(_ALPHABET + _PIECES), max_size=40).map("".join)


def test_the_extension_is_built() -> None:
    # Installs without a C compiler run tiktoken instead; this environment must build it, or the native
    # path would go untested here while deployments run it.
    assert bpe_native.available()


@dataclass(frozen=True)
class Case:
    tok: Tokenizer
    native: _bytebpe.Encoder
    split: pre_tokenizers.Split  # Hugging Face running the same regex


@pytest.fixture(scope="module", params=["qwen", "llama3"])
def case(request: pytest.FixtureRequest) -> Case:
    tok: Tokenizer = request.getfixturevalue(f"{request.param}_tokenizer")
    assert tok.encode_path.encoder == "native", tok.encode_path.encoder_reason
    assert tok._fast is not None and tok._fast._native is not None
    pattern = bpe_native.QWEN2_SPLIT if request.param == "qwen" else bpe_native.LLAMA3_SPLIT
    return Case(tok, tok._fast._native, pre_tokenizers.Split(Regex(pattern), behavior="isolated"))


def _hf_pieces(case: Case, text: str) -> list[str]:
    return [piece for piece, _ in case.split.pre_tokenize_str(text)]


def _tiktoken_ids(case: Case, text: str) -> list[int]:
    assert case.tok._fast is not None
    return list(case.tok._fast._encoding.encode_ordinary(text))


def _ids(native: _bytebpe.Encoder, text: str, *, plain: bool = True) -> list[int] | None:
    """The ids as plain text (``plain``), or with added tokens matched and SLOW characters declined (None)."""
    ids = native.encode(text, plain)
    if ids is None:
        return None
    out = array("I")
    out.frombytes(ids)
    return out.tolist()


@pytest.mark.parametrize(("bit", "pattern"), [(_bytebpe.L, r"\p{L}"), (_bytebpe.N, r"\p{N}"), (_bytebpe.WS, r"\s")])
def test_character_classes_agree_with_hugging_face_on_every_code_point(bit: int, pattern: str) -> None:
    table = bpe_native.character_classes()
    every = "".join(_BMP + _ASTRAL)
    outside = pre_tokenizers.Split(Regex(pattern), behavior="removed").pre_tokenize_str(every)
    rest = {c for piece, _ in outside for c in piece}
    hf = {c for c in every if c not in rest}
    ours = {c for c in every if table[ord(c)] & bit}
    assert ours == hf, sorted(f"U+{ord(c):04X}" for c in ours ^ hf)[:20]


def test_split_matches_hugging_face_on_every_code_point(case: Case) -> None:
    """Each BMP character after a letter, after an apostrophe (the contractions, case-folded), between
    numbers, before white space and a newline; every astral one after an apostrophe."""
    bmp = "".join(f"x{c}'{c}e {c}1{c}\t{c} \n" for c in _BMP)
    assert case.native.split(bmp) == _hf_pieces(case, bmp)
    astral = "".join(f"'{c}" for c in _ASTRAL)
    assert case.native.split(astral) == _hf_pieces(case, astral)


@_SETTINGS
@given(text=_texts)
def test_split_matches_hugging_face(case: Case, text: str) -> None:
    assert case.native.split(text) == _hf_pieces(case, text)


@_SETTINGS
@given(text=_texts)
def test_ids_match_tiktoken(case: Case, text: str) -> None:
    assert _ids(case.native, text) == _tiktoken_ids(case, text)


def _long_pieces() -> list[str]:
    rng = random.Random(7)
    return [
        "a" * 5_000,
        "".join(rng.choice(string.ascii_letters) for _ in range(3_000)),
        "".join(chr(rng.randrange(0x4E00, 0x9FA6)) for _ in range(2_000)),
        "".join(rng.choice("中文字符ひらがなカタカナ한국어") for _ in range(700)),
        " " * 600 + "x",
        "9" * 1_000,
        "!?" * 900,
        "é" * 400,
    ]


def test_long_pieces_merge_as_tiktoken_does(case: Case) -> None:
    """Pieces over 24 bytes take the heap; their ids must still be tiktoken's."""
    for text in _long_pieces():
        assert _ids(case.native, text) == _tiktoken_ids(case, text), text[:20]


def test_remembered_merges_give_the_same_ids(case: Case) -> None:
    """Merged words are cached by hash (direct-mapped, up to 24 bytes and 8 ids): a repeat, a word sharing a
    slot, a prefix or extension of a cached word, and words too long to cache all keep tiktoken's ids."""
    rng = random.Random(3)
    words = ["".join(rng.choice("qxzjkvwbf") for _ in range(rng.randrange(2, 30))) for _ in range(3000)]
    words += [w[:-1] for w in words[:200]] + [w + "q" for w in words[:200]]
    text = " ".join(words)
    first = _ids(case.native, text)
    assert first == _ids(case.native, text) == _tiktoken_ids(case, text)


def test_a_megabyte_of_letters_encodes_in_linear_time(case: Case) -> None:
    # One piece of 10**6 letters: merging by scanning would take minutes (the test's timeout fails it),
    # the heap takes well under a second.
    text = "ab" * 500_000
    assert _ids(case.native, text) == _tiktoken_ids(case, text)


@pytest.mark.parametrize("corpus", ["prose", "code", "cjk", "latin", "json"])
def test_real_text_encodes_as_hugging_face_does(case: Case, corpus: corpora.Corpus) -> None:
    try:
        units = corpora.units(corpus)
    except corpora.CorpusError as exc:
        pytest.skip(str(exc))
    text = "\n\n".join(units[:400])[:60_000]
    assert _ids(case.native, text) == list(case.tok.raw.encode(text, add_special_tokens=False).ids)


def test_bad_arguments_raise() -> None:
    classes = bpe_native.character_classes()
    ranks = {bytes([b]): b for b in range(256)}
    with pytest.raises(ValueError, match="single byte"):
        _bytebpe.Encoder({b"a": 0}, classes, 1)
    with pytest.raises(ValueError, match="code point"):
        _bytebpe.Encoder(ranks, b"\0" * 10, 1)
    with pytest.raises(ValueError, match="digit_run"):
        _bytebpe.Encoder(ranks, classes, 2)
    with pytest.raises(TypeError):
        _bytebpe.Encoder({"a": 0}, classes, 1)  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="ranks"):
        _bytebpe.Encoder({**ranks, b"ab": 2**32 - 1}, classes, 1)
    encoder = _bytebpe.Encoder(ranks, classes, 1)
    with pytest.raises(TypeError):
        encoder.encode(b"bytes")  # type: ignore[arg-type]
    with pytest.raises(UnicodeEncodeError):
        encoder.encode("a\ud800")
    with pytest.raises(RuntimeError, match="immutable"):
        encoder.__init__(ranks, classes, 1)  # type: ignore[misc]
    with pytest.raises(RuntimeError, match="not initialized"):
        _bytebpe.Encoder.__new__(_bytebpe.Encoder).encode("x")
    assert _ids(encoder, "ab c") == [97, 98, 32, 99]
    with pytest.raises(TypeError, match="non-empty str"):
        _bytebpe.Encoder(ranks, classes, 1, {"": 5})
    with pytest.raises(ValueError, match="2\\*\\*31"):
        _bytebpe.Encoder(ranks, classes, 1, {"<x>": -1})


def test_other_split_regexes_keep_tiktoken(deepseek_tokenizer: Tokenizer) -> None:
    assert deepseek_tokenizer.encode_path.encoder == "tiktoken"
    assert deepseek_tokenizer.encode_path.encoder_reason == "the split regex is neither Qwen2's nor Llama-3's"
    assert isinstance(bpe_native.build([bpe_native.QWEN2_SPLIT, r"\p{N}+"], {}), str)


def test_added_tokens_are_matched_leftmost_longest_before_splitting() -> None:
    ranks = {bytes([b]): b for b in range(256)}
    added = {"<a>": 1000, "<a>>": 1001, "<b": 1002, "b>": 1003}
    encoder = _bytebpe.Encoder(ranks, bpe_native.character_classes(), 1, added)
    # leftmost first ("<b" before "b>"), then the longest at a position ("<a>>" over "<a>")
    assert _ids(encoder, "x<b>y<a>>z<a>", plain=False) == [120, 1002, 62, 121, 1001, 122, 1000]
    assert _ids(encoder, "x<b>y", plain=True) == [120, 60, 98, 62, 121]  # plain: no added tokens
    assert _ids(encoder, "<a", plain=False) == [60, 97]  # a prefix of a token is text


def test_llama3_with_its_added_tokens_encodes_as_hugging_face_does(llama3_tokenizer: Tokenizer) -> None:
    assert llama3_tokenizer._fast is not None and llama3_tokenizer._fast._native is not None
    native = llama3_tokenizer._fast._native
    text = "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi <|eot_id|x <|eot_id|><|eot_id|>"
    assert _ids(native, text, plain=False) == list(llama3_tokenizer.raw.encode(text, add_special_tokens=False).ids)


def test_an_nfc_tokenizer_declines_texts_that_may_not_be_in_nfc(qwen_tokenizer: Tokenizer) -> None:
    assert qwen_tokenizer._fast is not None and qwen_tokenizer._fast._native is not None
    native = qwen_tokenizer._fast._native
    assert _ids(native, "café naïve — ok", plain=False) is not None  # precomposed: in NFC
    assert _ids(native, "cafe\u0301", plain=False) is None  # a combining mark
    assert _ids(native, "\u1100\u1161", plain=False) is None  # Hangul jamo that compose
    assert _ids(native, "cafe\u0301", plain=True) is not None  # plain: the caller normalized already


_NOT_SUSPECT = [c for c in _BMP[0x80:0x3400] if ord(c) not in nfc.suspects()]


@_SETTINGS
@given(text=st.lists(st.sampled_from([*_NOT_SUSPECT, "a", " ", "가"]), max_size=30).map("".join))
def test_a_text_without_suspects_is_in_nfc_on_both_sides(text: str) -> None:
    # What lets the native encoder take such a text as it is: neither side's NFC changes it.
    assert unicodedata.is_normalized("NFC", text)
    assert hf_normalizers.NFC().normalize_str(text) == text


def test_every_pair_nfc_composes_holds_a_suspect() -> None:
    # Exhaustive for the compositions in Python's tables; Hangul composes by rule (V and T are suspects).
    suspects = nfc.suspects()
    for code in range(0x80, 0x110000):
        if 0xD800 <= code <= 0xDFFF:
            continue
        decomposition = unicodedata.decomposition(chr(code))
        if not decomposition or decomposition.startswith("<") or len(decomposition.split()) != 2:
            continue
        first, second = (int(part, 16) for part in decomposition.split())
        pair = chr(first) + chr(second)
        if unicodedata.normalize("NFC", pair) != pair:
            assert first in suspects or second in suspects, f"U+{code:04X}"
    assert all(jamo in suspects for jamo in (0x1161, 0x1175, 0x11A8, 0x11C2))
