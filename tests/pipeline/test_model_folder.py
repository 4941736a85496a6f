from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from node.pipeline.model import ModelFolderError, load_model_folder

SMALL_FILES = ("tokenizer_config.json", "config.json", "generation_config.json")


def write_json(path: Path, value: object) -> None:
    path.write_text(json.dumps(value), encoding="utf-8")


@pytest.fixture
def llama3_copy(llama3_model_dir: Path, tmp_path: Path) -> Path:
    """The llama3 folder's metadata and a stub tokenizer.json (added_tokens_decoder resolves every id)."""
    folder = tmp_path / "my-llama"
    folder.mkdir()
    for name in SMALL_FILES:
        shutil.copy(llama3_model_dir / name, folder / name)
    (folder / "tokenizer.json").write_text("{}")
    return folder


def test_llama3_folder(llama3_model_dir: Path) -> None:
    folder = load_model_folder(llama3_model_dir)
    assert folder.path == llama3_model_dir
    assert folder.name == "llama3"
    assert folder.tokenizer_path == llama3_model_dir / "tokenizer.json"
    assert folder.chat_template is not None and "<|start_header_id|>" in folder.chat_template
    assert (folder.bos_token, folder.eos_token) == ("<|begin_of_text|>", "<|eot_id|>")
    assert folder.add_bos_token is True
    assert folder.bos_token_id == 128000
    assert folder.eos_token_ids == (128001, 128009)
    assert folder.max_context_length == 8192
    assert folder.model_type == "llama"
    assert folder.architectures == ("LlamaForCausalLM",)


def test_deepseek_folder_reads_added_token_objects(deepseek_model_dir: Path) -> None:
    folder = load_model_folder(str(deepseek_model_dir))
    # tokenizer_config stores these as {"__type": "AddedToken", "content": ...}
    assert (folder.bos_token, folder.eos_token) == ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>")
    assert folder.add_bos_token is False
    assert (folder.bos_token_id, folder.eos_token_ids) == (0, (1,))
    assert folder.max_context_length == 163840
    assert folder.model_type == "deepseek_v3"


def test_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(ModelFolderError, match="does not exist") as info:
        load_model_folder(tmp_path / "nope")
    assert info.value.path == tmp_path / "nope"


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json", "config.json"])
def test_missing_required_file_is_named(llama3_copy: Path, name: str) -> None:
    (llama3_copy / name).unlink()
    with pytest.raises(ModelFolderError, match="missing") as info:
        load_model_folder(llama3_copy)
    assert info.value.path == llama3_copy / name
    assert name in str(info.value)


@pytest.mark.parametrize("name", SMALL_FILES)
def test_malformed_json_is_named(llama3_copy: Path, name: str) -> None:
    (llama3_copy / name).write_text('{"bos_token": ')
    with pytest.raises(ModelFolderError, match="malformed JSON") as info:
        load_model_folder(llama3_copy)
    assert info.value.path == llama3_copy / name


def test_wrong_field_type_names_file_and_key(llama3_copy: Path) -> None:
    config = json.loads((llama3_copy / "config.json").read_text())
    write_json(llama3_copy / "config.json", {**config, "max_position_embeddings": "8k"})
    with pytest.raises(ModelFolderError, match="'max_position_embeddings' must be an integer") as info:
        load_model_folder(llama3_copy)
    assert info.value.path == llama3_copy / "config.json"


def test_generation_config_is_optional(llama3_copy: Path) -> None:
    (llama3_copy / "generation_config.json").unlink()
    folder = load_model_folder(llama3_copy)
    assert folder.eos_token_ids == (128009,)  # config.json's eos, which is also the tokenizer's


def test_token_ids_fall_back_to_tokenizer_json(tmp_path: Path) -> None:
    # No added_tokens_decoder: ids come from tokenizer.json, added tokens over the base vocabulary.
    write_json(
        tmp_path / "tokenizer.json",
        {"added_tokens": [{"id": 7, "content": "</s>"}], "model": {"vocab": {"<s>": 1, "</s>": 2}}},
    )
    write_json(
        tmp_path / "tokenizer_config.json",
        {"bos_token": "<s>", "eos_token": "</s>", "model_max_length": 1e30},
    )
    write_json(tmp_path / "config.json", {})
    folder = load_model_folder(tmp_path)
    assert (folder.bos_token_id, folder.eos_token_ids) == (1, (7,))
    assert folder.max_context_length is None  # transformers' "no limit" sentinel is not a context length
    assert folder.architectures == ()


def test_model_max_length_used_without_max_position_embeddings(tmp_path: Path) -> None:
    write_json(tmp_path / "tokenizer.json", {})
    write_json(tmp_path / "tokenizer_config.json", {"model_max_length": 4096})
    write_json(tmp_path / "config.json", {"eos_token_id": [2, 3, 2]})
    folder = load_model_folder(tmp_path)
    assert folder.max_context_length == 4096
    assert folder.eos_token_ids == (2, 3)
    assert folder.chat_template is None


@pytest.mark.parametrize("form", ["named_list", "side_file"])
def test_other_chat_template_forms(tmp_path: Path, form: str) -> None:
    write_json(tmp_path / "tokenizer.json", {})
    write_json(tmp_path / "config.json", {})
    if form == "named_list":
        templates = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]
        write_json(tmp_path / "tokenizer_config.json", {"chat_template": templates})
    else:
        write_json(tmp_path / "tokenizer_config.json", {})
        (tmp_path / "chat_template.jinja").write_text("D")
    assert load_model_folder(tmp_path).chat_template == "D"
