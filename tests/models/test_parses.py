"""TokenizerParses: one parse per tokenizer.json content, shared by the loaders of one process (the demo's
node and simulated workers); a changed file is parsed anew."""

from __future__ import annotations

from pathlib import Path

import pytest
import tokenizers
from tokenizers.models import WordLevel

from node.models.parses import TokenizerParses
from node.pipeline.tokenizer import Tokenizer
from node.sim.model_folder import load_model_folder


def _definition(*words: str) -> bytes:
    vocab = {"[UNK]": 0} | {w: i for i, w in enumerate(words, start=1)}
    raw = tokenizers.Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    raw.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    return raw.to_str().encode()


def test_the_same_content_is_parsed_once() -> None:
    parses = TokenizerParses()
    data = _definition("hello", "world")
    first = parses.parse(data)
    assert parses.parse(bytes(data)) is first  # equal content, another bytes object
    assert first.encode("hello world").ids == [1, 2]


def test_changed_content_is_parsed_anew_never_served_stale() -> None:
    parses = TokenizerParses()
    old = parses.parse(_definition("hello", "world"))
    new = parses.parse(_definition("world", "hello"))
    assert new is not old
    assert new.encode("hello world").ids == [2, 1]


def test_an_invalid_definition_raises_through_the_loaders_error() -> None:
    parses = TokenizerParses()
    with pytest.raises(Exception):  # noqa: B017 - the binding raises a bare Exception
        parses.parse(b'{"model": 1}')
    with pytest.raises(ValueError, match="not a valid tokenizer definition"):
        Tokenizer.from_bytes(b'{"model": 1}', parses=parses)


def test_the_node_and_the_simulated_engine_share_one_parse(llama3_model_dir: Path) -> None:
    parses = TokenizerParses()
    _, sim_tokenizer = load_model_folder(str(llama3_model_dir), parses=parses)
    node_tokenizer = Tokenizer.from_file(llama3_model_dir, parses=parses)
    assert node_tokenizer.raw is sim_tokenizer
