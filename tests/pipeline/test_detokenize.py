from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from node.pipeline.detokenize import IncrementalDetokenizer

from . import _tokenizers

FFFD = "\ufffd"

# Tokenizer-backed examples take ~1 ms each and the grid below multiplies them: keep the count modest.
TOKENIZER_SETTINGS = settings(max_examples=25, deadline=None)

# (name, loader): the two real byte-level vocabularies on their fast (context-free) path and on the general
# path, plus the tiny SentencePiece byte-fallback tokenizer with both decoder styles.
TOKENIZERS: dict[str, Callable[[], Any]] = {
    "llama3": _tokenizers.llama3,
    "deepseek": _tokenizers.deepseek,
    "llama3-general": functools.partial(_tokenizers.as_sequence_decoder, "llama3"),
    "deepseek-general": functools.partial(_tokenizers.as_sequence_decoder, "deepseek"),
    "sp-metaspace": functools.partial(_tokenizers.sentencepiece, "metaspace"),
    "sp-llama2": functools.partial(_tokenizers.sentencepiece, "llama2"),
}
BYTE_FALLBACK = {"sp-metaspace", "sp-llama2"}

# Characters spanning 2-4 UTF-8 bytes (hence several byte-level or byte-fallback tokens), a ZWJ emoji
# sequence, and plain ASCII so words and spaces appear too.
ALPHABET = [
    *"ab zW.,!\n",
    "é",
    "ü",
    "你",
    "好",
    "中",
    "😀",
    "🎉",
    "👩",
    "\u200d",
    "👧",
    "𠜎",
    "\u00a0",
    "ß",
    "Ω",
]
# U+FFFD itself is excluded so that any U+FFFD in the output must come from a split character.
texts = st.text(
    st.one_of(st.sampled_from(ALPHABET), st.characters(codec="utf-8", exclude_characters=FFFD)), max_size=24
)


@functools.cache
def special_ids(name: str) -> tuple[int, ...]:
    added = TOKENIZERS[name]().get_added_tokens_decoder()
    return tuple(sorted(i for i, t in added.items() if t.special))[:12]


def random_ids(name: str) -> st.SearchStrategy[list[int]]:
    tok = TOKENIZERS[name]()
    vocab = tok.get_vocab_size(with_added_tokens=True)
    # Small ids are single bytes in all these vocabularies, so a bias towards them yields many partial
    # characters and invalid byte sequences.
    one = st.one_of(st.integers(0, 300), st.integers(0, vocab - 1), st.sampled_from(special_ids(name)))
    return st.lists(one, max_size=40)


def text_ids(name: str) -> st.SearchStrategy[list[int]]:
    tok = TOKENIZERS[name]()
    pieces = st.one_of(
        texts.map(lambda t: list(tok.encode(t, add_special_tokens=False).ids)),
        st.sampled_from(special_ids(name)).map(lambda i: [i]),
    )
    return st.lists(pieces, max_size=5).map(lambda ps: [i for p in ps for i in p])


@st.composite
def chunkings(draw: st.DrawFn, ids: list[int]) -> list[list[int]]:
    """Any split of ids into consecutive chunks, empty chunks included."""
    cuts = sorted(draw(st.lists(st.integers(0, len(ids)), max_size=len(ids) + 2)))
    bounds = [0, *cuts, len(ids)]
    return [ids[a:b] for a, b in itertools.pairwise(bounds)]


def decode(name: str, ids: Sequence[int], skip: bool) -> str:
    return str(TOKENIZERS[name]().decode(list(ids), skip_special_tokens=skip))


def settled(name: str, ids: Sequence[int], skip: bool) -> bool:
    """Reference for the documented hold rule: decode(ids) can no longer change, so must be fully emitted."""
    if decode(name, ids, skip).endswith(FFFD):
        return False
    if name not in BYTE_FALLBACK:
        return True
    tok = TOKENIZERS[name]()
    effective = [i for i in ids if not (skip and i in special_ids(name))]
    return not effective or not tok.id_to_token(effective[-1]).startswith("<0x")


def run(name: str, chunks: list[list[int]], skip: bool, prompt: Sequence[int] = ()) -> list[str]:
    """Stream the chunks, checking after every step that output so far is never retracted and that
    everything settled has been emitted. Returns the deltas, finish() last."""
    all_ids = [i for c in chunks for i in c]
    full = decode(name, [*prompt, *all_ids], skip)[len(decode(name, prompt, skip)) :]
    detok = IncrementalDetokenizer(TOKENIZERS[name](), skip_special_tokens=skip, prompt_ids=prompt)
    deltas: list[str] = []
    seen: list[int] = []
    for chunk in chunks:
        deltas.append(detok.step(chunk))
        seen += chunk
        out = "".join(deltas)
        assert full.startswith(out), (chunks, deltas)
        if not prompt and settled(name, seen, skip):
            assert out == decode(name, seen, skip), (chunks, deltas)
    deltas.append(detok.finish())
    assert "".join(deltas) == full, (chunks, deltas)
    return deltas


@pytest.mark.parametrize("skip", [True, False])
@pytest.mark.parametrize("name", TOKENIZERS)
@TOKENIZER_SETTINGS
@given(data=st.data())
def test_text_streams_exactly_and_never_splits_a_character(name: str, skip: bool, data: st.DataObject) -> None:
    ids = data.draw(text_ids(name))
    deltas = run(name, data.draw(chunkings(ids)), skip)
    # The ids encode valid text, so any U+FFFD would be half of a character split across tokens.
    assert not any(FFFD in d for d in deltas)


@pytest.mark.parametrize("skip", [True, False])
@pytest.mark.parametrize("name", TOKENIZERS)
@TOKENIZER_SETTINGS
@given(data=st.data())
def test_random_ids_stream_exactly(name: str, skip: bool, data: st.DataObject) -> None:
    # run() asserts output is always a prefix of the full decode: a U+FFFD is only ever emitted where the
    # full decode has one too.
    ids = data.draw(random_ids(name))
    run(name, data.draw(chunkings(ids)), skip)


@pytest.mark.parametrize("skip", [True, False])
@pytest.mark.parametrize("name", TOKENIZERS)
@TOKENIZER_SETTINGS
@given(data=st.data())
def test_prompt_context(name: str, skip: bool, data: st.DataObject) -> None:
    tok = TOKENIZERS[name]()
    # A rendered prompt ends on a complete token (chat templates end in markup), hence the trailing ".".
    prompt = tok.encode(data.draw(texts) + ".", add_special_tokens=False).ids
    ids = data.draw(st.one_of(text_ids(name), random_ids(name)))
    run(name, data.draw(chunkings(ids)), skip, prompt=prompt)


def ids_of(name: str, *tokens: str) -> list[int]:
    tok = TOKENIZERS[name]()
    return [tok.token_to_id(t) for t in tokens]


def test_emoji_is_held_until_complete_byte_level() -> None:
    tok = _tokenizers.llama3()
    ids = tok.encode("a😀", add_special_tokens=False).ids
    detok = IncrementalDetokenizer(tok, skip_special_tokens=True)
    deltas = [detok.step([i]) for i in ids]
    assert len(ids) > 2  # "😀" spans more than one token
    assert deltas[0] == "a"
    assert deltas[1:-1] == [""] * (len(ids) - 2)
    assert deltas[-1] == "😀"
    assert detok.finish() == ""


@pytest.mark.parametrize("style", ["metaspace", "llama2"])
def test_byte_fallback_run_is_held_until_it_ends(style: str) -> None:
    name = f"sp-{style}"
    emoji = ids_of(name, "<0xF0>", "<0x9F>", "<0x98>", "<0x80>")
    detok = IncrementalDetokenizer(TOKENIZERS[name](), skip_special_tokens=True)
    assert detok.step(ids_of(name, "▁Hello")) == "Hello"
    assert detok.step(ids_of(name, "▁")) == " "
    assert [detok.step([i]) for i in emoji] == ["", "", "", ""]
    assert detok.step(ids_of(name, "!")) == "😀!"
    # At the end of generation a complete run is released by finish().
    assert [detok.step([i]) for i in emoji] == ["", "", "", ""]
    assert detok.finish() == "😀"


def test_byte_fallback_run_invalidated_by_a_later_byte() -> None:
    # ByteFallback decodes a run of byte tokens all-or-nothing: a stray continuation byte after a complete
    # "é" turns the whole run into U+FFFDs. tokenizers.decoders.DecodeStream emits "é" and then raises
    # "Invalid prefix"; holding the open run keeps the stream equal to decode().
    name = "sp-llama2"
    ids = ids_of(name, "<0xC3>", "<0xA9>", "<0xA9>", "a")
    detok = IncrementalDetokenizer(TOKENIZERS[name](), skip_special_tokens=False)
    assert [detok.step([i]) for i in ids] == ["", "", "", FFFD * 3 + "a"]
    assert decode(name, ids, skip=False) == FFFD * 3 + "a"


def test_skipped_special_token_does_not_end_a_byte_run() -> None:
    name = "sp-metaspace"
    ids = ids_of(name, "<0xC3>", "</s>", "<0xA9>", "a")
    for skip, expected in [(True, "éa"), (False, f"{FFFD}</s>{FFFD}a")]:
        detok = IncrementalDetokenizer(TOKENIZERS[name](), skip_special_tokens=skip)
        assert "".join([detok.step(ids[:2]), detok.step(ids[2:3]), detok.step(ids[3:])]) == expected


@pytest.mark.parametrize("style", ["metaspace", "llama2"])
def test_prompt_keeps_the_leading_space(style: str) -> None:
    name = f"sp-{style}"
    tok = TOKENIZERS[name]()
    world = ids_of(name, "▁world")
    assert IncrementalDetokenizer(tok, skip_special_tokens=True).step(world) == "world"
    prompt = tok.encode("Hello", add_special_tokens=False).ids
    detok = IncrementalDetokenizer(tok, skip_special_tokens=True, prompt_ids=prompt)
    assert detok.step(world) == " world"


@pytest.mark.parametrize(
    ("name", "prompt", "generated", "expected"),
    [
        ("sp-llama2", ["▁Hello", "<0xC3>"], ["<0xA9>", "▁world"], FFFD + " world"),
        ("llama3-general", ["Hello", "Ã"], ["©", "Ġworld"], FFFD + " world"),  # 0xC3 | 0xA9
    ],
)
def test_prompt_ending_mid_character_is_not_used_as_context(
    name: str, prompt: list[str], generated: list[str], expected: str
) -> None:
    # The character straddling prompt and output has no right answer; what matters is that neither prompt
    # text leaks nor the stream stalls.
    detok = IncrementalDetokenizer(TOKENIZERS[name](), skip_special_tokens=True, prompt_ids=ids_of(name, *prompt))
    assert detok.step(ids_of(name, *generated)) == expected


@pytest.mark.parametrize("name", ["llama3", "deepseek"])
@pytest.mark.parametrize("skip", [True, False])
def test_special_tokens(name: str, skip: bool) -> None:
    tok: Any = TOKENIZERS[name]()
    eos = special_ids(name)[1]
    ids = [*tok.encode("Hi", add_special_tokens=False).ids, eos]
    detok = IncrementalDetokenizer(tok, skip_special_tokens=skip)
    out = "".join(detok.step([i]) for i in ids) + detok.finish()
    assert out == ("Hi" if skip else "Hi" + tok.id_to_token(eos))


def test_trailing_invalid_byte_is_released_by_finish() -> None:
    # DecodeStream never returns text ending in U+FFFD, so it would drop this tail.
    tok = _tokenizers.llama3()
    ids = [*tok.encode("ok", add_special_tokens=False).ids, tok.token_to_id("Ã")]  # lone 0xC3 byte
    detok = IncrementalDetokenizer(tok, skip_special_tokens=True)
    assert detok.step(ids) == ""
    assert detok.finish() == "ok" + FFFD
    assert detok.finish() == ""
