"""Which parsers fit a model, from its chat template and its tokenizer's special tokens.

Each family's markup is distinctive enough that the first matching rule below decides; the rules are
ordered so that more specific markup (Qwen3-Coder's ``<function=``) is tested before the generic
(``<tool_call>``). A model with none of the markers gets no parsers: its output is plain content.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class ParserChoice:
    tool_parser: str | None
    reasoning_parser: str | None


def detect_parsers(chat_template: str, special_tokens: Iterable[str]) -> ParserChoice:
    """The (tool parser, reasoning parser) names for a model, by vLLM's names; None where none applies."""
    tokens = set(special_tokens)

    def has(marker: str) -> bool:
        return marker in tokens or marker in chat_template

    # Reasoning is judged by the template alone: tokenizers also carry <think> for models that never
    # think (DeepSeek-V3 shares R1's vocabulary).
    thinks = "<think>" in chat_template
    if has("<|channel|>") and has("<|message|>"):
        return ParserChoice("openai", "gpt_oss")
    if has("<|tool_calls_section_begin|>"):
        return ParserChoice("kimi_k2", "kimi_k2" if thinks else None)
    if has("<｜tool▁calls▁begin｜>"):
        # V3 writes the call type and a ```json fence; V3.1 writes the bare name and arguments.
        tools = "deepseek_v3" if "```json" in chat_template else "deepseek_v31"
        return ParserChoice(tools, "deepseek_r1" if thinks else None)
    if "<arg_key>" in chat_template:
        return ParserChoice("glm45", "glm45" if thinks else None)
    if "<function=" in chat_template and "<parameter=" in chat_template:
        return ParserChoice("qwen3_coder", "qwen3" if thinks else None)
    if has("<tool_call>"):
        return ParserChoice("hermes", "qwen3" if thinks else None)
    if has("[TOOL_CALLS]"):
        return ParserChoice("mistral", None)
    if has("<|python_start|>") or "<|header_start|>" in chat_template:
        return ParserChoice("llama4_pythonic", None)
    if has("<|python_tag|>") or "<|start_header_id|>" in chat_template:
        return ParserChoice("llama3_json", None)
    return ParserChoice(None, "deepseek_r1" if thinks else None)


def detect_folder(folder: Path, added_tokens: Iterable[str] | None = None) -> ParserChoice:
    """`detect_parsers` for a Hugging Face-style model folder (tokenizer_config.json's chat_template and
    added tokens, plus tokenizer.json's added tokens). A caller that has loaded the tokenizer passes its
    ``added_tokens``, sparing a second parse of tokenizer.json (~0.2 s for a 128k vocabulary).

    Raises:
        OSError: tokenizer_config.json cannot be read.
        ValueError: it is not a JSON object.
    """
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    if not isinstance(config, dict):
        raise ValueError(f"{folder / 'tokenizer_config.json'} is not a JSON object")
    template = config.get("chat_template")
    text = template if isinstance(template, str) else ""
    if isinstance(template, list):  # the named-templates form: [{"name": ..., "template": ...}]
        text = "\n".join(t["template"] for t in template if isinstance(t, dict) and isinstance(t.get("template"), str))
    tokens: list[str] = []
    decoder = config.get("added_tokens_decoder")
    if isinstance(decoder, dict):
        tokens += [t["content"] for t in decoder.values() if isinstance(t, dict) and isinstance(t.get("content"), str)]
    if added_tokens is not None:
        return detect_parsers(text, [*tokens, *added_tokens])
    try:
        tokenizer = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        tokenizer = {}
    added = tokenizer.get("added_tokens") if isinstance(tokenizer, dict) else None
    if isinstance(added, list):
        tokens += [t["content"] for t in added if isinstance(t, dict) and isinstance(t.get("content"), str)]
    return detect_parsers(text, tokens)
