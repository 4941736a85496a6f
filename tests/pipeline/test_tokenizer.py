from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import tokenizers
from tokenizers.decoders import DecodeStream

from node.pipeline.model import ModelFolderError, load_model_folder
from node.pipeline.tokenizer import Tokenizer

TEXT = "Hello world, this is a test"
LLAMA3_TEXT_IDS = [9906, 1917, 11, 420, 374, 264, 1296]
LLAMA3_SPECIALS = {
    "<|begin_of_text|>": 128000,
    "<|end_of_text|>": 128001,
    "<|start_header_id|>": 128006,
    "<|end_header_id|>": 128007,
    "<|eot_id|>": 128009,
}
DEEPSEEK_SPECIALS = {
    "<｜begin▁of▁sentence｜>": 0,
    "<｜end▁of▁sentence｜>": 1,
    "<｜User｜>": 128803,
    "<｜Assistant｜>": 128804,
    "<｜tool▁calls▁begin｜>": 128806,
    "<｜tool▁sep｜>": 128814,
}


def test_llama3_ids_match_reference(llama3_tokenizer: Tokenizer) -> None:
    assert llama3_tokenizer.encode(TEXT, add_special_tokens=False) == LLAMA3_TEXT_IDS


@pytest.mark.parametrize("family", ["llama3", "deepseek"])
def test_special_tokens_follow_add_bos_token(family: str, request: pytest.FixtureRequest) -> None:
    # The folder's add_bos_token and the tokenizer's post-processor agree: BOS is added exactly when declared.
    folder = load_model_folder(request.getfixturevalue(f"{family}_model_dir"))
    tokenizer: Tokenizer = request.getfixturevalue(f"{family}_tokenizer")
    plain = tokenizer.encode(TEXT, add_special_tokens=False)
    expected = [folder.bos_token_id, *plain] if folder.add_bos_token else plain
    assert tokenizer.encode(TEXT, add_special_tokens=True) == expected


@pytest.mark.parametrize(("family", "specials"), [("llama3", LLAMA3_SPECIALS), ("deepseek", DEEPSEEK_SPECIALS)])
def test_special_token_text_encodes_to_one_id(
    family: str, specials: dict[str, int], request: pytest.FixtureRequest
) -> None:
    tokenizer: Tokenizer = request.getfixturevalue(f"{family}_tokenizer")
    for text, token_id in specials.items():
        assert tokenizer.encode(text, add_special_tokens=False) == [token_id], text
        assert tokenizer.token_to_id(text) == token_id
        assert tokenizer.id_to_token(token_id) == text


def test_special_token_ids_are_the_added_tokens_marked_special(
    llama3_tokenizer: Tokenizer, deepseek_tokenizer: Tokenizer
) -> None:
    assert llama3_tokenizer.special_token_ids == frozenset(range(128000, 128256))
    assert {0, 1} <= deepseek_tokenizer.special_token_ids
    # DeepSeek's role markers are added tokens but not special ones: they survive skip_special_tokens.
    assert 128803 not in deepseek_tokenizer.special_token_ids


def test_decode(llama3_tokenizer: Tokenizer) -> None:
    ids = [128000, *LLAMA3_TEXT_IDS, 128009]
    assert llama3_tokenizer.decode(ids, skip_special_tokens=True) == TEXT
    assert llama3_tokenizer.decode(ids, skip_special_tokens=False) == f"<|begin_of_text|>{TEXT}<|eot_id|>"


def test_deepseek_round_trips_unicode(deepseek_tokenizer: Tokenizer) -> None:
    text = "<｜User｜>你好, wörld 🎉<｜Assistant｜>"
    ids = deepseek_tokenizer.encode(text, add_special_tokens=False)
    assert ids[0] == 128803 and ids[-1] == 128804
    assert deepseek_tokenizer.decode(ids, skip_special_tokens=False) == text


def test_encode_batch_matches_encode(llama3_tokenizer: Tokenizer) -> None:
    texts = [TEXT, "", "<|eot_id|> tail", "naïve café 🎉"]
    for flag in (False, True):
        assert llama3_tokenizer.encode_batch(texts, add_special_tokens=flag) == [
            llama3_tokenizer.encode(t, add_special_tokens=flag) for t in texts
        ]


def test_vocabulary_facts(llama3_tokenizer: Tokenizer, deepseek_tokenizer: Tokenizer) -> None:
    assert llama3_tokenizer.vocab_size == 128256
    assert deepseek_tokenizer.vocab_size == 129280
    assert llama3_tokenizer.token_to_id("<|no such token|>") is None
    assert llama3_tokenizer.id_to_token(10**9) is None


def test_fingerprint_is_sha256_of_tokenizer_json(
    llama3_tokenizer: Tokenizer, deepseek_tokenizer: Tokenizer, llama3_model_dir: Path
) -> None:
    expected = hashlib.sha256((llama3_model_dir / "tokenizer.json").read_bytes()).hexdigest()
    assert llama3_tokenizer.fingerprint == expected
    assert deepseek_tokenizer.fingerprint != expected


def test_raw_drives_decode_stream(llama3_tokenizer: Tokenizer) -> None:
    assert isinstance(llama3_tokenizer.raw, tokenizers.Tokenizer)
    stream = DecodeStream(skip_special_tokens=True)
    pieces = [stream.step(llama3_tokenizer.raw, token_id) for token_id in LLAMA3_TEXT_IDS]
    assert "".join(p for p in pieces if p is not None) == TEXT


def test_from_file_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ModelFolderError, match="cannot read") as info:
        Tokenizer.from_file(tmp_path)  # a folder without tokenizer.json
    assert info.value.path == tmp_path / "tokenizer.json"
    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"model": 3}')
    with pytest.raises(ModelFolderError, match="not a valid tokenizer") as info:
        Tokenizer.from_file(bad)
    assert info.value.path == bad
