from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from node.models import prepare
from node.models.prepare import (
    FAMILIES,
    STAMP_FILE,
    MissingModelPackageError,
    PrepareError,
    default_models_dir,
    prepare_model,
)

FOLDER_FILES = ("tokenizer.json", "tokenizer_config.json", "config.json", "generation_config.json")


def read_json(path: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads(path.read_text(encoding="utf-8"))
    return data


def test_families_lists_both() -> None:
    assert FAMILIES == ("llama3", "deepseek")


@pytest.mark.parametrize("fixture", ["llama3_model_dir", "deepseek_model_dir"])
def test_folder_is_complete(fixture: str, request: pytest.FixtureRequest) -> None:
    folder: Path = request.getfixturevalue(fixture)
    assert folder.name in FAMILIES
    for name in FOLDER_FILES:
        assert (folder / name).is_file(), name
    tok_config = read_json(folder / "tokenizer_config.json")
    assert isinstance(tok_config["chat_template"], str)
    assert tok_config["chat_template"] == (
        Path(prepare.__file__).parent / "templates" / f"{folder.name}.jinja"
    ).read_text(encoding="utf-8")
    assert isinstance(tok_config["added_tokens_decoder"], dict)


def test_llama3_metadata_matches_published_folder(llama3_model_dir: Path) -> None:
    config = read_json(llama3_model_dir / "config.json")
    generation = read_json(llama3_model_dir / "generation_config.json")
    tok_config = read_json(llama3_model_dir / "tokenizer_config.json")
    assert config["max_position_embeddings"] == 8192
    assert config["vocab_size"] == 128256
    assert generation["eos_token_id"] == [128001, 128009]
    assert tok_config["bos_token"] == "<|begin_of_text|>"
    assert tok_config["eos_token"] == "<|eot_id|>"
    decoder = tok_config["added_tokens_decoder"]
    assert isinstance(decoder, dict)
    assert decoder["128009"]["content"] == "<|eot_id|>"
    assert decoder["128009"]["special"] is True


def test_second_call_reuses_the_folder(llama3_model_dir: Path) -> None:
    before = {name: (llama3_model_dir / name).stat().st_mtime_ns for name in FOLDER_FILES}
    assert prepare_model("llama3", llama3_model_dir.parent) == llama3_model_dir
    assert {name: (llama3_model_dir / name).stat().st_mtime_ns for name in FOLDER_FILES} == before


@pytest.mark.parametrize("damage", ["missing_file", "stale_stamp"])
def test_incomplete_or_stale_folder_is_rebuilt(damage: str, deepseek_model_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "deepseek"
    shutil.copytree(deepseek_model_dir, folder)
    if damage == "missing_file":
        (folder / "config.json").unlink()
    else:
        (folder / STAMP_FILE).write_text("built by an older smg-node")
        (folder / "tokenizer_config.json").write_text("{}")
    assert prepare_model("deepseek", tmp_path) == folder
    for name in (*FOLDER_FILES, STAMP_FILE):
        assert (folder / name).read_bytes() == (deepseek_model_dir / name).read_bytes(), name
    assert not [p.name for p in folder.iterdir() if p.name.endswith(".tmp")]


def test_missing_package_names_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    spec = prepare._SPECS["deepseek"]
    monkeypatch.setitem(
        prepare._SPECS,
        "deepseek",
        dataclasses.replace(spec, package="smg_node_no_such_package"),
    )
    with pytest.raises(MissingModelPackageError, match=r"smg-node\[models\]"):
        prepare_model("deepseek", tmp_path)
    assert not (tmp_path / "deepseek").exists()


def test_unknown_family_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(PrepareError, match="llama3, deepseek"):
        prepare_model("gpt2", tmp_path)  # type: ignore[arg-type]


def test_default_models_dir_follows_xdg() -> None:
    assert default_models_dir({"XDG_CACHE_HOME": "/var/cache/me"}) == Path("/var/cache/me/smg-node/models")
    home_default = Path.home() / ".cache" / "smg-node" / "models"
    assert default_models_dir({}) == home_default
    assert default_models_dir({"XDG_CACHE_HOME": "relative/dir"}) == home_default  # invalid per XDG
