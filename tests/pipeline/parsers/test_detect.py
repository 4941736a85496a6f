"""Choosing parsers from a model folder: chat template markers and tokenizer special tokens."""

from __future__ import annotations

from pathlib import Path

import pytest

from node.pipeline.parsers.detect import ParserChoice, detect_folder, detect_parsers
from node.pipeline.parsers.registry import REASONING_PARSERS, TOOL_PARSERS


def test_prepared_folders(llama3_model_dir: Path, deepseek_model_dir: Path, qwen_model_dir: Path) -> None:
    assert detect_folder(llama3_model_dir) == ParserChoice("llama3_json", None)
    # DeepSeek-V3's vocabulary has <think> (shared with R1) but our V3 template never opens it.
    assert detect_folder(deepseek_model_dir) == ParserChoice("deepseek_v3", None)
    assert detect_folder(qwen_model_dir) == ParserChoice("hermes", "qwen3")


def test_added_tokens_of_a_loaded_tokenizer_detect_alike(
    llama3_model_dir: Path, deepseek_model_dir: Path, qwen_model_dir: Path
) -> None:
    """The simulated engine passes its loaded tokenizer's added tokens instead of a re-parse of tokenizer.json."""
    from tokenizers import Tokenizer

    for folder in (llama3_model_dir, deepseek_model_dir, qwen_model_dir):
        raw = Tokenizer.from_file(str(folder / "tokenizer.json"))
        added = [token.content for token in raw.get_added_tokens_decoder().values()]
        assert detect_folder(folder, added_tokens=added) == detect_folder(folder)


# Snippets of each family's published chat template (and special tokens) that the rules key on.
@pytest.mark.parametrize(
    ("template", "tokens", "expected"),
    [
        ("<|start|>{{ role }}<|channel|>final<|message|>", ["<|return|>"], ParserChoice("openai", "gpt_oss")),
        ("<|tool_calls_section_begin|>... <think>", [], ParserChoice("kimi_k2", "kimi_k2")),
        (
            "{{'<｜tool▁call▁begin｜>' + tool['function']['name'] + '<｜tool▁sep｜>'}}",
            ["<｜tool▁calls▁begin｜>"],
            ParserChoice("deepseek_v31", None),
        ),
        ("<｜tool▁calls▁begin｜>...```json...<｜Assistant｜><think>\n", [], ParserChoice("deepseek_v3", "deepseek_r1")),
        (
            "<tool_call>{{ name }}\n<arg_key>{{ k }}</arg_key><arg_value>{{ v }}</arg_value> <think>",
            [],
            ParserChoice("glm45", "glm45"),
        ),
        ("<tool_call>\n<function={{ name }}>\n<parameter={{ p }}>", ["<tool_call>"], ParserChoice("qwen3_coder", None)),
        ("<|im_start|>", ["<tool_call>", "<think>"], ParserChoice("hermes", None)),  # Qwen2.5: no thinking
        ("[AVAILABLE_TOOLS]", ["[TOOL_CALLS]"], ParserChoice("mistral", None)),
        ("<|header_start|>assistant<|header_end|>", ["<|python_start|>"], ParserChoice("llama4_pythonic", None)),
        ("<|start_header_id|>assistant<|end_header_id|>", ["<|python_tag|>"], ParserChoice("llama3_json", None)),
        ("{{ messages }}", ["<s>"], ParserChoice(None, None)),
    ],
)
def test_rules(template: str, tokens: list[str], expected: ParserChoice) -> None:
    choice = detect_parsers(template, tokens)
    assert choice == expected
    assert choice.tool_parser is None or choice.tool_parser in TOOL_PARSERS
    assert choice.reasoning_parser is None or choice.reasoning_parser in REASONING_PARSERS
