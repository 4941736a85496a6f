"""The fast paths (native and tiktoken): which tokenizers take them, and that they are id-identical to
Hugging Face. The native encoder's own splitting is tested in test_bpe_native.py."""

from __future__ import annotations

import json
from array import array
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from node.config import TokenizerCacheConfig
from node.pipeline import bpe_fast
from node.pipeline.encode_rules import read_added_tokens
from node.pipeline.probe_corpus import probe_texts
from node.pipeline.special_tokens import AddedTokenMatcher
from node.pipeline.tokenizer import Tokenizer
from tests.pipeline import _crafted_tokenizers as crafted
from tests.pipeline import _tokenizers
from tests.pipeline._texts import adversarial_text

LLAMA3_SPECIALS = ("<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|end_of_text|>")
DEEPSEEK_SPECIALS = (
    "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<｜tool▁sep｜>",
    "<｜tool▁calls▁begin｜>", "<｜/table>｜", "｜DSML｜", "<dsml:", "</dsml:", "<think>", "</think>", "<|EOT|>",
)  # fmt: skip
_SETTINGS = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _reference(tok: Tokenizer, text: str, flag: bool) -> list[int]:
    return list(tok.raw.encode(text, add_special_tokens=flag).ids)


@pytest.mark.parametrize(("family", "encoder"), [("llama3", "native"), ("qwen", "native"), ("deepseek", "tiktoken")])
def test_real_tokenizers_take_the_fast_path(family: str, encoder: str, request: pytest.FixtureRequest) -> None:
    tok: Tokenizer = request.getfixturevalue(f"{family}_tokenizer")
    assert tok.encode_path.encoder == encoder, tok.encode_path.encoder_reason
    assert tok.encode_path.prefix_cache, tok.encode_path.prefix_cache_reason


def test_native_false_keeps_tiktoken(llama3_tiktoken: Tokenizer) -> None:
    assert llama3_tiktoken.encode_path.encoder == "tiktoken"
    assert llama3_tiktoken.encode_path.encoder_reason == "not requested"


@pytest.fixture(scope="module", params=["native", "tiktoken"])
def llama3_both(request: pytest.FixtureRequest, llama3_tokenizer: Tokenizer, llama3_tiktoken: Tokenizer) -> Tokenizer:
    """Llama-3 through either fast encoder (the native one by default, tiktoken where it is not built)."""
    tok = llama3_tokenizer if request.param == "native" else llama3_tiktoken
    assert tok.encode_path.encoder == request.param, tok.encode_path.encoder_reason
    return tok


def _fresh_cache(tok: Tokenizer) -> Tokenizer:
    """The tokenizer behind an empty cache that takes even short texts into L1: its encode then runs the
    array path (`FastBpeEncoder.encode_into`), L0 for texts without an added token, L1 for the others."""
    return tok.with_cache(TokenizerCacheConfig(l1_min_prompt_chars=0))


@_SETTINGS
@given(text=adversarial_text(LLAMA3_SPECIALS), flag=st.booleans())
def test_llama3_fast_equals_hf(llama3_both: Tokenizer, text: str, flag: bool) -> None:
    expected = _reference(llama3_both, text, flag)
    assert llama3_both.encode_uncached(text, add_special_tokens=flag) == expected
    assert _fresh_cache(llama3_both).encode(text, add_special_tokens=flag) == expected


@_SETTINGS
@given(text=adversarial_text(DEEPSEEK_SPECIALS), flag=st.booleans())
def test_deepseek_fast_equals_hf(deepseek_tokenizer: Tokenizer, text: str, flag: bool) -> None:
    expected = _reference(deepseek_tokenizer, text, flag)
    assert deepseek_tokenizer.encode_uncached(text, add_special_tokens=flag) == expected
    assert _fresh_cache(deepseek_tokenizer).encode(text, add_special_tokens=flag) == expected


@pytest.mark.parametrize("family", ["llama3", "llama3_tiktoken", "deepseek", "qwen", "qwen_tiktoken"])
def test_encode_into_appends_the_ids_encode_returns_on_every_route(family: str, request: pytest.FixtureRequest) -> None:
    """Plain text, text with added tokens (matched by tiktoken, or by the matcher for DeepSeek's
    overlapping ones), text NFC changes (qwen normalizes) and text Hugging Face must take."""
    tok: Tokenizer = request.getfixturevalue(family if family.endswith("_tiktoken") else f"{family}_tokenizer")
    fast = tok._fast
    assert fast is not None
    added = [t.content for t in read_added_tokens(tok.raw)][:8]
    texts = ["plain words", f"a{added[0]}b{added[-1]}", "e\u0301t\u00e9 caf\u00e9", "Ǆ ǅ ﬀ Å", *probe_texts(added)]
    for text in texts:
        out = array("i", [7, 8])
        fast.encode_into(text, out)
        assert out.tolist() == [7, 8, *fast.encode(text)] == [7, 8, *_reference(tok, text, False)], text


@pytest.mark.parametrize("family", ["llama3", "deepseek"])
def test_every_added_token_and_probe_text(family: str, request: pytest.FixtureRequest) -> None:
    tok: Tokenizer = request.getfixturevalue(f"{family}_tokenizer")
    added = [t.content for t in read_added_tokens(tok.raw)]
    texts = [*probe_texts(added), *added, "".join(f"{a}{a[1:]}{a[:-1]}" for a in added)]
    ours = [tok.encode_uncached(t, add_special_tokens=False) for t in texts]
    assert ours == [e.ids for e in tok.raw.encode_batch(texts, add_special_tokens=False)]


def test_long_prompt(llama3_tokenizer: Tokenizer, llama3_tiktoken: Tokenizer, deepseek_tokenizer: Tokenizer) -> None:
    text = "".join(probe_texts(LLAMA3_SPECIALS + DEEPSEEK_SPECIALS)) * 3
    for tok in (llama3_tokenizer, llama3_tiktoken, deepseek_tokenizer):
        assert tok.encode_uncached(text, add_special_tokens=True) == _reference(tok, text, True)


def test_texts_on_other_threads_encode_like_hf(llama3_both: Tokenizer) -> None:
    # tiktoken: texts on a thread other than the loading one go through that thread's own copy; the native
    # encoder is shared, and releases the GIL on long texts (the longest here, ~40 kB).
    texts = [f"{i} " + "".join(probe_texts(LLAMA3_SPECIALS)) * (i % 3) * 4 for i in range(6)]
    with ThreadPoolExecutor(3) as pool:
        ours = list(pool.map(lambda t: llama3_both.encode_uncached(t, add_special_tokens=True), texts))
    assert ours == [_reference(llama3_both, t, True) for t in texts]


def test_the_loading_thread_keeps_the_verified_encoding_and_others_get_their_own(llama3_model_dir: Any) -> None:
    """The loading thread owns the verified encoding's regex pools, so it encodes with it (a copy would cost
    ~0.1 s and ~21 MB); any other thread, the event loop's included, encodes with a copy of its own, made by
    `warm_this_thread` or its first encode."""
    tok = Tokenizer.from_file(llama3_model_dir, native=False)
    fast = tok._fast
    assert fast is not None
    assert fast._local.encoding is fast._encoding
    text = "Hello, world! " * 10

    def on_a_new_thread(warm: bool) -> tuple[bool, list[int]]:
        assert getattr(fast._local, "encoding", None) is None
        if warm:
            tok.warm_this_thread()
        ids = tok.encode_uncached(text, add_special_tokens=False)
        own = fast._local.encoding
        return own is not None and own is not fast._encoding, ids

    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(on_a_new_thread, True).result() == (True, _reference(tok, text, False))
    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(on_a_new_thread, False).result() == (True, _reference(tok, text, False))


def test_lone_surrogates_are_rejected_like_hf(llama3_both: Tokenizer) -> None:
    with pytest.raises(TypeError):
        llama3_both.raw.encode("a\ud800b")
    with pytest.raises(TypeError):
        llama3_both.encode_uncached("a\ud800b", add_special_tokens=False)


@pytest.mark.parametrize("encoder", ["native", "tiktoken"])
def test_trained_byte_level_bpe_takes_the_fast_path(encoder: str) -> None:
    tok = crafted.wrap(crafted.byte_bpe(), native=encoder == "native")  # it splits with Llama-3's regex
    assert tok.encode_path.encoder == encoder, tok.encode_path.encoder_reason
    text = "The quick brown fox <|eot|> said 12345 naïve 🎉<|bos|>"
    assert tok.encode_uncached(text, add_special_tokens=True) == _reference(tok, text, True)


def _definition(tok: Any) -> dict[str, Any]:
    return dict(json.loads(tok.to_str()))


def _plan(definition: dict[str, Any], tok: Any) -> object:
    return bpe_fast.plan(definition, read_added_tokens(tok))


def test_declines_what_tiktoken_cannot_express() -> None:
    hf = crafted.byte_bpe()
    base = _definition(hf)
    assert not isinstance(_plan(base, hf), str)

    unigram = _tokenizers.sentencepiece("metaspace")
    assert "not BPE" in str(_plan(_definition(unigram), unigram))

    nfkc = {**base, "normalizer": {"type": "NFKC"}}
    assert "normalizer" in str(_plan(nfkc, hf))
    nfc = {**base, "normalizer": {"type": "NFC"}}
    assert not isinstance(_plan(nfc, hf), str)  # NFC alone is normalized in Python first (test_nfc.py)

    prefix_space = json.loads(json.dumps(base))
    prefix_space["pre_tokenizer"]["pretokenizers"][-1]["add_prefix_space"] = True
    assert "prefix space" in str(_plan(prefix_space, hf))

    anchored = json.loads(json.dumps(base))
    anchored["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"^\s+|\w+"
    assert "not expressible" in str(_plan(anchored, hf))

    shuffled = json.loads(json.dumps(base))
    merges = shuffled["model"]["merges"]
    merges[0], merges[-1] = merges[-1], merges[0]
    assert "merge priority" in str(_plan(shuffled, hf))

    stripping = json.loads(json.dumps(base))
    stripping["added_tokens"][0]["rstrip"] = True
    hf_stripping = type(hf).from_str(json.dumps(stripping))
    assert "strips whitespace" in str(_plan(stripping, hf_stripping))


def test_declines_on_a_probe_difference() -> None:
    hf = crafted.byte_bpe()
    definition = _definition(hf)
    added = read_added_tokens(hf)

    def off_by_one(text: str) -> list[int]:  # a reference that disagrees on one probe
        ids = list(hf.encode(text, add_special_tokens=False).ids)
        return [*ids, 0] if "fox" in text else ids

    result = bpe_fast.build(definition, AddedTokenMatcher(added), off_by_one, probe_texts(a.content for a in added))
    assert isinstance(result, str) and "differ" in result


@pytest.fixture(scope="module", params=["native", "tiktoken"])
def overlapping(request: pytest.FixtureRequest) -> Tokenizer:
    # "x<|a" (second pass) can start before "<|a|>" (first pass), and some specials nest: tiktoken's own
    # special matching would get these wrong; the fast path uses Hugging Face's two-pass semantics.
    hf = crafted.byte_bpe(crafted.OVERLAPPING, ("x<|a", "ST]x|"))
    tok = crafted.wrap(hf, cache=None, native=request.param == "native")
    assert tok.encode_path.encoder == request.param, tok.encode_path.encoder_reason
    return tok


@_SETTINGS
@given(text=adversarial_text((*crafted.OVERLAPPING, "x<|a", "ST]x|")), flag=st.booleans())
def test_overlapping_added_tokens_fast_equals_hf(overlapping: Tokenizer, text: str, flag: bool) -> None:
    assert overlapping.encode(text, add_special_tokens=flag) == _reference(overlapping, text, flag)
