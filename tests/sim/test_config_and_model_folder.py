"""SimWorkerConfig validation, the stop-gap argparse front end, and reading a model folder."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from node.pipeline.model import load_model_folder as load_gateway_folder
from node.sim import SimModel, SimWorkerConfig
from node.sim.__main__ import parse_config
from node.sim.errors import ModelFolderError
from node.sim.model_folder import DEFAULT_MAX_CONTEXT_LENGTH, load_model_folder
from node.sim.vocabulary import vocabulary_from_pieces


def test_every_field_has_a_default_and_help() -> None:
    config = SimWorkerConfig()
    for item in dataclasses.fields(config):
        assert item.metadata.get("help"), item.name
    assert config.host == "127.0.0.1"
    assert config.port == 50051
    assert config.role == "regular"
    assert config.kv_role == ""
    assert SimWorkerConfig(role="prefill").kv_role == "kv_producer"
    assert SimWorkerConfig(role="decode").kv_role == "kv_consumer"


@pytest.mark.parametrize(
    ("field", "value"),
    [("port", 70000), ("tpot_ms", -1.0), ("block_size", 0), ("tokens_per_chunk", 0), ("role", "both")],
)
def test_bad_values_name_their_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        SimWorkerConfig(**{field: value})  # type: ignore[arg-type]


def test_argparse_front_end_maps_every_field() -> None:
    config = parse_config(
        [
            "--model-path",
            "/m",
            "--port",
            "0",
            "--tpot-ms",
            "0",
            "--role",
            "prefill",
            "--tokens-per-chunk",
            "4",
        ]
    )
    assert config == SimWorkerConfig(model_path="/m", port=0, tpot_ms=0.0, role="prefill", tokens_per_chunk=4)
    with pytest.raises(SystemExit):
        parse_config(["--block-size", "0"])


def test_model_folder_facts(sim_model: SimModel, model_dir: Path) -> None:
    folder = sim_model.folder
    assert folder.served_model_name == model_dir.name
    assert folder.model_type == "llama"
    assert folder.architectures == ("LlamaForCausalLM",)
    assert folder.max_context_length == 8192
    assert folder.vocab_size == 128256
    assert folder.eos_token_ids == (128001, 128009)
    assert folder.primary_eos_token_id == 128009  # tokenizer_config's eos_token
    assert set(folder.stop_eos_token_ids) == {128001, 128009}
    assert folder.bos_token_id == 128000
    assert dict(folder.sampling_defaults) == {"temperature": 0.6, "top_p": 0.9}
    vocabulary = sim_model.vocabulary
    assert len(vocabulary.words) > 1000
    assert vocabulary.comma == 11 and vocabulary.period == 13
    assert sim_model.tokenizer.decode(list(vocabulary.function_words[:3])) == " the of and"


def test_minimal_folder_falls_back_to_defaults(tmp_path: Path, model_dir: Path) -> None:
    (tmp_path / "tokenizer.json").write_bytes((model_dir / "tokenizer.json").read_bytes())
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 128001}))
    folder, _ = load_model_folder(str(tmp_path), "custom-name")
    assert folder.served_model_name == "custom-name"
    assert folder.max_context_length == DEFAULT_MAX_CONTEXT_LENGTH
    assert folder.eos_token_ids == (128001,)
    assert folder.primary_eos_token_id == 128001
    assert folder.bos_token_id is None


@pytest.mark.parametrize("problem", ["empty", "missing", "no-tokenizer", "bad-json"])
def test_broken_folders_raise_model_folder_error(tmp_path: Path, model_dir: Path, problem: str) -> None:
    path = str(tmp_path / "absent") if problem == "missing" else str(tmp_path)
    if problem == "empty":
        path = ""
    if problem == "bad-json":
        (tmp_path / "tokenizer.json").write_bytes((model_dir / "tokenizer.json").read_bytes())
        (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelFolderError):
        load_model_folder(path)


def test_vocabulary_drops_fragments_keeps_inflected_words() -> None:
    pieces = [" the", " integr", " integration", " decision", " decisions", ",", ".", " Hello", "x"]
    vocabulary = vocabulary_from_pieces(pieces)
    assert vocabulary.words == (3, 4)  # " integr" is a fragment of " integration"; " the" is a function word
    assert vocabulary.function_words == (0,)
    assert vocabulary.capitalized == (7,)
    assert (vocabulary.comma, vocabulary.period) == (5, 6)
    with pytest.raises(ValueError):
        vocabulary_from_pieces(["x", "y"])


def test_the_sim_and_the_gateway_read_a_folder_alike(sim_model: SimModel, model_dir: Path) -> None:
    """One reader of model folders (node/pipeline/model.py): the facts both report agree."""
    gateway = load_gateway_folder(model_dir)
    sim = sim_model.folder
    assert (sim.model_type, sim.architectures) == (gateway.model_type, gateway.architectures)
    assert (sim.max_context_length, sim.bos_token_id) == (gateway.max_context_length, gateway.bos_token_id)
    assert set(sim.stop_eos_token_ids) == set(gateway.eos_token_ids)


@pytest.mark.parametrize(
    ("file", "text"),
    [
        ("config.json", '{"architectures": "LlamaForCausalLM"}'),
        ("config.json", '{"max_position_embeddings": "long"}'),
        ("generation_config.json", '{"eos_token_id": ["end"]}'),
        ("tokenizer_config.json", '{"eos_token": 7}'),
    ],
)
def test_a_malformed_field_names_its_file(tmp_path: Path, model_dir: Path, file: str, text: str) -> None:
    (tmp_path / "tokenizer.json").write_bytes((model_dir / "tokenizer.json").read_bytes())
    (tmp_path / file).write_text(text)
    with pytest.raises(ModelFolderError, match=file):
        load_model_folder(str(tmp_path))
