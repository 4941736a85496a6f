"""Translating Hugging Face Split chains into one tiktoken regex."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import tiktoken
from hypothesis import HealthCheck, given, settings

from node.pipeline.bpe_fast import _split_patterns
from node.pipeline.split_regex import GPT2_PATTERN, UnsupportedPattern, class_run, compose, restrict
from node.pipeline.tokenizer import Tokenizer
from tests.pipeline import _crafted_tokenizers as crafted
from tests.pipeline._texts import adversarial_text

# Chains that exercise each part of the translation: GPT-2's regex (no Split), gaps left by a split that
# does not cover every character (the catch-all), and class runs before a split with a lookahead.
CHAINS = {
    "gpt2": (),
    "gaps": (r"\p{L}+|[0-9]",),
    "runs": (r"\p{N}{1,2}", r"[一-龥ぁ-ん]+", r" ?\p{L}+|\s+(?!\S)|\s+|[^\s\p{L}]+"),
}


@functools.cache
def _tokenizer(chain: str) -> Tokenizer:
    return crafted.wrap(crafted.train_byte_bpe(500, CHAINS[chain]), cache=None)


@pytest.mark.parametrize("pattern", [r"^\s+", r"a$", r"(a)\1", r"a++", r"[[:alpha:]]", r"\d+", r"a*", r"(?=a)", r"\bx"])
def test_rejects_what_it_cannot_translate_faithfully(pattern: str) -> None:
    with pytest.raises(UnsupportedPattern):
        restrict(pattern)


def test_class_runs() -> None:
    assert class_run(r"\p{N}{1,3}") == r"\p{N}"
    assert class_run(r"[一-龥]+") is not None
    assert class_run(r"\p{L}{2,3}") is None
    assert class_run(r"a|b") is None
    assert class_run(r"\s*") is None


def test_restriction_reaches_lookaheads_and_classes() -> None:
    assert restrict(r"\s+(?!\S)", r"\p{N}") == r"[\s&&[^\p{N}]]+(?![\S&&[^\p{N}]])"
    assert restrict(r"ba{,2}") == "ba{0,2}"
    assert compose([GPT2_PATTERN]).startswith("(?:'s|'t|")


def test_lookaround_free_branches_are_grouped_for_the_dfa() -> None:
    """fancy_regex tries a top-level alternation with a lookaround branch by branch in its VM; a run of
    lookaround-free branches in one group is one DFA search (the speed, module docstring)."""
    composed = compose([GPT2_PATTERN])
    easy = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+"
    assert composed.startswith(f"(?:{easy})|\\s+(?!\\S)|\\s+|(?:(?!")
    # A bare flag reaches the end of its enclosing group: that pattern stays whole in its own group.
    assert compose([r"(?i)ab|c(?!d)|e"]).startswith(r"(?:(?i)ab|c(?!d)|e)|")


@functools.cache
def _encodings(folder: Path) -> tuple[tiktoken.Encoding, tiktoken.Encoding]:
    """The fast encoder's verified encoding of a prepared folder, and the same with the flat regex."""
    tok = Tokenizer.from_file(folder, cache=None)
    assert tok._fast is not None
    grouped = tok._fast._encoding
    patterns = _split_patterns(json.loads((folder / "tokenizer.json").read_text())["pre_tokenizer"])
    assert isinstance(patterns, list)
    assert grouped._pat_str == compose(patterns)
    flat = tiktoken.Encoding(
        "flat", pat_str=compose(patterns, grouped=False), mergeable_ranks=grouped._mergeable_ranks, special_tokens={}
    )
    return grouped, flat


@pytest.mark.parametrize("fixture", ["llama3_model_dir", "qwen_model_dir", "deepseek_model_dir"])
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(text=adversarial_text())
def test_grouping_changes_no_match(fixture: str, text: str, request: pytest.FixtureRequest) -> None:
    """The grouped regex and the same branches in one flat alternation encode every text alike."""
    grouped, flat = _encodings(request.getfixturevalue(fixture))
    assert grouped.encode_ordinary(text) == flat.encode_ordinary(text)


@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_chains_take_the_fast_path(chain: str) -> None:
    assert _tokenizer(chain).encode_path.encoder == "tiktoken", _tokenizer(chain).encode_path.encoder_reason


@pytest.mark.parametrize("chain", sorted(CHAINS))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=adversarial_text())
def test_composed_regex_splits_like_the_chain(chain: str, text: str) -> None:
    tok = _tokenizer(chain)
    assert tok.encode_uncached(text, add_special_tokens=False) == tok.raw.encode(text, add_special_tokens=False).ids
