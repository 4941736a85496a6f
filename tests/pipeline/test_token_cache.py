"""The two-level tokenizer cache: cached ids equal uncached ones, whatever the cache holds."""

from __future__ import annotations

import dataclasses
import functools
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from node.config import TokenizerCacheConfig
from node.pipeline.encode_rules import Affixes, read_added_tokens, segmentation_hazard
from node.pipeline.model import load_model_folder
from node.pipeline.probe_corpus import probe_texts
from node.pipeline.special_tokens import AddedTokenMatcher
from node.pipeline.template import ChatTemplate
from node.pipeline.token_cache import TokenCache, TokenCacheStats
from node.pipeline.tokenizer import Tokenizer
from tests.pipeline import _crafted_tokenizers as crafted
from tests.pipeline._texts import adversarial_text

_SETTINGS = settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
# Every cut kept, every text through L1: short texts exercise the prefix cache as long ones do.
DENSE = {"l1_spacing_chars": 1, "l1_min_prompt_chars": 0}
LLAMA3_SPECIALS = ("<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|begin_of_text|>")
DEEPSEEK_SPECIALS = (
    "<｜User｜>",
    "<｜Assistant｜>",
    "<｜end▁of▁sentence｜>",
    "<｜tool▁sep｜>",
    "<｜/table>｜",
    "｜DSML｜",
)
# ~2,000 tokens of varied text: the shared system prompt of the multi-turn tests and the benchmark.
LONG_SYSTEM = "\n".join(probe_texts(()))[:6000] + " You are a helpful assistant. " * 40


def _reference(tok: Tokenizer, text: str, flag: bool) -> list[int]:
    return list(tok.raw.encode(text, add_special_tokens=flag).ids)


def _template(model_dir: Path) -> ChatTemplate:
    folder = load_model_folder(model_dir)
    assert folder.chat_template is not None
    return ChatTemplate(folder.chat_template, bos_token=folder.bos_token, eos_token=folder.eos_token)


Conversation = tuple[str | None, list[tuple[str, str, bool]]]


def _conversations(specials: tuple[str, ...]) -> st.SearchStrategy[Conversation]:
    """(system prompt, [(user, assistant, add_special_tokens first), ...])."""
    content = adversarial_text(specials, max_pieces=6)
    system = st.one_of(st.none(), st.just(LONG_SYSTEM), content)
    return st.tuples(system, st.lists(st.tuples(content, content, st.booleans()), min_size=1, max_size=4))


def _check_conversation(
    tok: Tokenizer, template: ChatTemplate, system: str | None, turns: list[tuple[str, str, bool]]
) -> None:
    history: list[dict[str, Any]] = [{"role": "system", "content": system}] if system is not None else []
    for user, assistant, flag in turns:
        history.append({"role": "user", "content": user})
        prompt = template.render(history, add_generation_prompt=True)
        # Either flag may be the one that fills the prefix cache; the other then reads it.
        for add_special_tokens in (flag, not flag):
            assert tok.encode(prompt, add_special_tokens=add_special_tokens) == _reference(
                tok, prompt, add_special_tokens
            )
        history.append({"role": "assistant", "content": assistant})


def _l1_hits(tok: Tokenizer) -> int:
    stats = tok.cache_stats()
    assert stats is not None
    return stats.l1.hits


@pytest.fixture(params=["default", "dense"])
def llama3(request: pytest.FixtureRequest, llama3_tokenizer: Tokenizer) -> Tokenizer:
    return llama3_tokenizer if request.param == "default" else _dense(llama3_tokenizer)


@pytest.fixture(params=["default", "dense"])
def deepseek(request: pytest.FixtureRequest, deepseek_tokenizer: Tokenizer) -> Tokenizer:
    return deepseek_tokenizer if request.param == "default" else _dense(deepseek_tokenizer)


@functools.cache
def _dense(tok: Tokenizer) -> Tokenizer:
    return tok.with_cache(TokenizerCacheConfig(**DENSE))


@_SETTINGS
@given(conversation=_conversations(LLAMA3_SPECIALS))
def test_llama3_multi_turn_cached_equals_uncached(
    llama3: Tokenizer, llama3_model_dir: Path, conversation: Conversation
) -> None:
    _check_conversation(llama3, _template(llama3_model_dir), *conversation)


@_SETTINGS
@given(conversation=_conversations(DEEPSEEK_SPECIALS))
def test_deepseek_multi_turn_cached_equals_uncached(
    deepseek: Tokenizer, deepseek_model_dir: Path, conversation: Conversation
) -> None:
    _check_conversation(deepseek, _template(deepseek_model_dir), *conversation)


@pytest.mark.parametrize("family", ["llama3", "deepseek"])
def test_later_turns_reuse_the_earlier_prefix(family: str, request: pytest.FixtureRequest) -> None:
    tok: Tokenizer = request.getfixturevalue(f"{family}_tokenizer")
    template = _template(request.getfixturevalue(f"{family}_model_dir"))
    history: list[dict[str, Any]] = [{"role": "system", "content": LONG_SYSTEM + family + " reuse"}]
    hits = []
    for turn in range(4):
        history.append({"role": "user", "content": f"question {turn}?"})
        prompt = template.render(history, add_generation_prompt=True)
        before = _l1_hits(tok)
        assert tok.encode(prompt, add_special_tokens=False) == _reference(tok, prompt, False)
        hits.append(_l1_hits(tok) - before)
        history.append({"role": "assistant", "content": f"answer {turn}."})
    assert hits[1:] == [1, 1, 1]


@pytest.mark.parametrize("family", ["llama3", "deepseek"])
def test_prepare_leaves_only_the_uncached_suffix_to_encode(family: str, request: pytest.FixtureRequest) -> None:
    """The lookup tells how much text is left, so a cached chat turn is finished inline, not on a thread."""
    shared: Tokenizer = request.getfixturevalue(f"{family}_tokenizer")
    tok = shared.with_cache(TokenizerCacheConfig())  # a cache of its own: empty
    template = _template(request.getfixturevalue(f"{family}_model_dir"))
    history: list[dict[str, Any]] = [{"role": "system", "content": LONG_SYSTEM}]
    pending = []
    for turn in range(3):
        history.append({"role": "user", "content": f"question {turn}?"})
        prompt = template.render(history, add_generation_prompt=True)
        job = tok.prepare(prompt, add_special_tokens=False)
        pending.append(job.pending_chars)
        assert job.finish() == _reference(tok, prompt, False)
        history.append({"role": "assistant", "content": f"answer {turn}."})
    assert pending[0] == len(template.render(history[:2], add_generation_prompt=True)), "an empty cache"
    # The last answer and the new question with their headers (Llama-3's template adds a date line).
    assert all(0 < p < 200 for p in pending[1:]), pending
    # The same text again: only what follows its last special token (the header's blank line) is left.
    again = tok.prepare(prompt, add_special_tokens=True)
    assert again.pending_chars <= 2 and again.finish() == _reference(tok, prompt, True)


def test_prepare_without_a_cache_leaves_everything() -> None:
    tok = Tokenizer.from_bytes(crafted.byte_bpe(crafted.OVERLAPPING, ()).to_str().encode(), cache=None)
    job = tok.prepare("hello world", add_special_tokens=True)
    assert job.pending_chars == len("hello world")
    assert job.finish() == _reference(tok, "hello world", True)


# Added tokens matched in Hugging Face's second pass, overlapping the first-pass ones.
SECOND_PASS = ("ST]x|", "zz<|")
OVERLAPPING_ALL = (*crafted.OVERLAPPING, *SECOND_PASS)
_OVERLAPPING_CACHE = TokenizerCacheConfig(l0_max_bytes=20_000, l1_max_bytes=3_000, **DENSE)


@pytest.fixture(scope="module", params=["native", "tiktoken", "huggingface"])
def overlapping(request: pytest.FixtureRequest) -> Tokenizer:
    hf = crafted.byte_bpe(crafted.OVERLAPPING, SECOND_PASS)
    encoder = request.param
    tok = crafted.wrap(hf, cache=_OVERLAPPING_CACHE, fast=encoder != "huggingface", native=encoder == "native")
    assert tok.encode_path.encoder == encoder, tok.encode_path.encoder_reason
    assert tok.encode_path.prefix_cache, tok.encode_path.prefix_cache_reason
    return tok


@settings(max_examples=200, deadline=None)
@given(texts=st.lists(adversarial_text(OVERLAPPING_ALL), min_size=1, max_size=4))
def test_overlapping_specials_cached_equals_uncached(overlapping: Tokenizer, texts: list[str]) -> None:
    # Consecutive texts extend each other, so later ones are encoded from cached prefixes; the small
    # budgets keep evicting.
    text = ""
    for piece in texts:
        text += piece
        for flag in (False, True):
            assert overlapping.encode(text, add_special_tokens=flag) == _reference(overlapping, text, flag)
    stats = overlapping.cache_stats()
    assert stats is not None
    assert stats.l0.bytes <= _OVERLAPPING_CACHE.l0_max_bytes
    assert stats.l1.bytes <= _OVERLAPPING_CACHE.l1_max_bytes


@settings(max_examples=200, deadline=None)
@given(text=adversarial_text(OVERLAPPING_ALL))
def test_matcher_finds_what_hf_extracts(overlapping: Tokenizer, text: str) -> None:
    added = read_added_tokens(overlapping.raw)
    ids = {t.id for t in added}
    encoding = overlapping.raw.encode(text, add_special_tokens=False)
    hf_spans = [span for token_id, span in zip(encoding.ids, encoding.offsets, strict=True) if token_id in ids]
    assert AddedTokenMatcher(added).spans(text) == hf_spans


def test_leftmost_longest_keeps_long_specials_whole(overlapping: Tokenizer) -> None:
    matcher = AddedTokenMatcher(read_added_tokens(overlapping.raw))
    assert matcher.spans("<|a|><|b|>") == [(0, 10)]
    assert matcher.spans("<|a|><|a|><|b|>") == [(0, 5), (5, 15)]
    assert matcher.spans("[INST] [/INST]x") == [(0, 14)]
    assert matcher.boundaries("<|a|>x<|b|>") == [5, 11]


def test_metaspace_first_turns_the_prefix_cache_off() -> None:
    tok = crafted.wrap(crafted.metaspace("first"))
    assert not tok.encode_path.prefix_cache
    assert "first" in (tok.encode_path.prefix_cache_reason or "")
    text = "<s>hello world</s> again"
    assert tok.encode(text, add_special_tokens=False) == _reference(tok, text, False)


def test_probe_catches_a_hazard_the_structure_check_misses() -> None:
    # Claim prepend_scheme "always" for a tokenizer that really has "first": the piece-by-piece probe
    # must still see that a suffix gains a "▁".
    raw = crafted.metaspace("first")
    definition = json.loads(raw.to_str())
    definition["pre_tokenizer"]["prepend_scheme"] = "always"
    added = read_added_tokens(raw)

    def encode(text: str, flag: bool) -> list[int]:
        return list(raw.encode(text, add_special_tokens=flag).ids)

    reason = segmentation_hazard(
        definition,
        raw,
        matcher=AddedTokenMatcher(added),
        affixes=Affixes((), ()),
        encode=encode,
        probes=probe_texts(t.content for t in added),
    )
    assert reason is not None and "probe" in reason


@pytest.mark.parametrize("scheme", ["always", "never"])
@settings(max_examples=100, deadline=None)
@given(texts=st.lists(adversarial_text(("<s>", "</s>", "<unk>")), min_size=1, max_size=3))
def test_metaspace_other_schemes_are_exact_or_off(scheme: str, texts: list[str]) -> None:
    tok = _metaspace_tokenizer(scheme)
    text = ""
    for piece in texts:
        text += piece
        assert tok.encode(text, add_special_tokens=True) == _reference(tok, text, True)


@functools.cache
def _metaspace_tokenizer(scheme: str) -> Tokenizer:
    return crafted.wrap(crafted.metaspace(scheme), cache=TokenizerCacheConfig(**DENSE))


def test_threads_share_one_cache(llama3_tokenizer: Tokenizer, llama3_model_dir: Path) -> None:
    template = _template(llama3_model_dir)
    prompts = []
    for conv in range(6):
        history: list[dict[str, Any]] = [{"role": "system", "content": LONG_SYSTEM[: 500 + conv * 300]}]
        for turn in range(5):
            history.append({"role": "user", "content": f"conversation {conv} turn {turn} 🎉"})
            prompts.append(template.render(history, add_generation_prompt=True))
            history.append({"role": "assistant", "content": f"reply {turn}"})
    expected = [_reference(llama3_tokenizer, p, False) for p in prompts]
    cache = TokenCache(TokenizerCacheConfig(l0_max_bytes=200_000, l1_max_bytes=100_000, **DENSE))
    tok = llama3_tokenizer.with_cache(cache)
    barrier = threading.Barrier(4)

    def run(offset: int) -> list[tuple[int, list[int]]]:
        barrier.wait()
        order = [*range(offset, len(prompts)), *range(offset)] * 2
        return [(i, tok.encode(prompts[i], add_special_tokens=False)) for i in order]

    with ThreadPoolExecutor(4) as pool:
        results = [pair for pairs in pool.map(run, [0, 7, 13, 21]) for pair in pairs]
    assert all(ids == expected[i] for i, ids in results)
    stats = tok.cache_stats()
    assert stats is not None and stats.l1.hits > 0
    assert stats.l1.bytes <= 100_000 and stats.l0.bytes <= 200_000


def test_shared_cache_keeps_vocabularies_apart(llama3_tokenizer: Tokenizer) -> None:
    cache = TokenCache(TokenizerCacheConfig(**DENSE))
    a = crafted.wrap(crafted.byte_bpe(), cache=cache)
    b = crafted.wrap(crafted.byte_bpe(crafted.OVERLAPPING), cache=cache)
    assert a.fingerprint != b.fingerprint
    text = "<|bos|>same text<|eot|> here"
    assert a.encode(text, add_special_tokens=False) == _reference(a, text, False)
    assert b.encode(text, add_special_tokens=False) == _reference(b, text, False)
    assert a.encode(text, add_special_tokens=False) != b.encode(text, add_special_tokens=False)


def test_l0_hit_returns_a_fresh_list(llama3_tokenizer: Tokenizer) -> None:
    text = "a fresh list, please"
    first = llama3_tokenizer.encode(text, add_special_tokens=True)
    first.append(-1)
    assert llama3_tokenizer.encode(text, add_special_tokens=True) == _reference(llama3_tokenizer, text, True)


def test_stats_and_eviction_bounds() -> None:
    config = TokenizerCacheConfig(l0_max_bytes=4_000, l1_max_bytes=2_000, **DENSE)
    tok = crafted.wrap(crafted.byte_bpe(), cache=config)
    stats = tok.cache_stats()
    assert isinstance(stats, TokenCacheStats)
    assert (stats.l0.hits, stats.l0.misses, stats.l0.entries, stats.l0.bytes) == (0, 0, 0, 0)
    for text in ("hello <|eot|> world", "hello <|eot|> world", "hello <|eot|> world, again", "plain", "plain"):
        assert tok.encode(text, add_special_tokens=False) == _reference(tok, text, False)
    stats = tok.cache_stats()
    assert stats is not None
    # Texts with added tokens are served (and kept) by L1 only; "plain" goes through L0.
    assert (stats.l0.hits, stats.l0.misses, stats.l0.entries) == (1, 4, 1)
    assert (stats.l1.hits, stats.l1.misses) == (2, 1)
    for i in range(200):
        tok.encode(f"text {i} <|eot|> more {i} <|bos|>", add_special_tokens=i % 2 == 0)
        tok.encode(f"plain text number {i}", add_special_tokens=i % 2 == 0)
    stats = tok.cache_stats()
    assert stats is not None
    assert 0 < stats.l0.bytes <= 4_000 and stats.l0.evictions > 0
    assert 0 < stats.l1.bytes <= 2_000 and stats.l1.evictions > 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.l0.hits = 0  # type: ignore[misc]
    tok.clear_cache()
    stats = tok.cache_stats()
    assert stats is not None and stats.l0.entries == stats.l1.entries == stats.l0.bytes == stats.l1.bytes == 0


def test_disabled_levels_and_no_cache() -> None:
    off = crafted.wrap(crafted.byte_bpe(), cache=TokenizerCacheConfig(l0_enabled=False, l1_enabled=False))
    off.encode("x <|eot|> y", add_special_tokens=False)
    stats = off.cache_stats()
    assert stats is not None and stats.l0.misses == stats.l1.misses == 0
    assert not off.encode_path.prefix_cache
    none = crafted.wrap(crafted.byte_bpe(), cache=None)
    assert none.cache_stats() is None
    assert none.encode("x <|eot|> y", add_special_tokens=True) == off.encode("x <|eot|> y", add_special_tokens=True)


def test_config_is_documented_and_validated() -> None:
    for f in dataclasses.fields(TokenizerCacheConfig):
        assert f.metadata.get("help"), f.name
    with pytest.raises(ValueError, match="l1_max_bytes"):
        TokenizerCacheConfig(l1_max_bytes=-1)
    with pytest.raises(ValueError, match="l1_spacing_chars"):
        TokenizerCacheConfig(l1_spacing_chars=0)
    with pytest.raises(ValueError, match="l1_min_prompt_chars"):
        TokenizerCacheConfig(l1_min_prompt_chars=-1)


def test_with_cache_rebinds_without_reanalysis(llama3_tokenizer: Tokenizer) -> None:
    bare = llama3_tokenizer.with_cache(None)
    assert bare.cache_stats() is None and not bare.encode_path.prefix_cache
    assert bare.encode_path.encoder == llama3_tokenizer.encode_path.encoder
    shared = TokenCache(TokenizerCacheConfig(**DENSE))
    a, b = llama3_tokenizer.with_cache(shared), llama3_tokenizer.with_cache(shared)
    text = "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
    assert a.encode(text, add_special_tokens=True) == b.encode(text, add_special_tokens=True)
    stats = b.cache_stats()
    assert stats is not None and stats.l1.hits == 1  # b reused what a cached
    assert a.encode_batch([text, "x"], add_special_tokens=False) == bare.encode_batch(
        [text, "x"], add_special_tokens=False
    )
