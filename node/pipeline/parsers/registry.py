"""Parser names (vLLM's ``--tool-call-parser`` / ``--reasoning-parser`` names) and building a choice's
parser from them.

Harmony (gpt-oss) carries reasoning and tool calls in one format, so ``openai`` and ``gpt_oss`` both name
the one Harmony parser; chosen together they build it once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final

from node.pipeline.parsers.calls import ToolOptions
from node.pipeline.parsers.chain import ChainedParser, PlainParser
from node.pipeline.parsers.deepseek import deepseek_v3_parser, deepseek_v31_parser
from node.pipeline.parsers.events import StreamParser
from node.pipeline.parsers.glm45 import glm45_parser
from node.pipeline.parsers.harmony import HarmonyParser
from node.pipeline.parsers.hermes import hermes_parser
from node.pipeline.parsers.kimi_k2 import kimi_k2_parser
from node.pipeline.parsers.llama3_json import llama3_json_parser
from node.pipeline.parsers.mistral import mistral_parser
from node.pipeline.parsers.pythonic import pythonic_parser
from node.pipeline.parsers.qwen3_coder import qwen3_coder_parser
from node.pipeline.parsers.think import THINK_END, ThinkParser

HARMONY_TOOLS: Final = "openai"
HARMONY_REASONING: Final = "gpt_oss"

TOOL_PARSERS: Final[Mapping[str, Callable[[ToolOptions], StreamParser]]] = {
    "hermes": hermes_parser,
    "llama3_json": llama3_json_parser,
    "llama4_json": llama3_json_parser,
    "pythonic": pythonic_parser,
    "llama4_pythonic": pythonic_parser,
    "qwen3_coder": qwen3_coder_parser,
    "qwen3_xml": qwen3_coder_parser,
    "deepseek_v3": deepseek_v3_parser,
    "deepseek_v31": deepseek_v31_parser,
    "mistral": mistral_parser,
    "kimi_k2": kimi_k2_parser,
    "glm45": glm45_parser,
    HARMONY_TOOLS: HarmonyParser,
}

# Every listed reasoning format uses <think>…</think>; they differ in whether the prompt opens the block,
# which the caller says with ``in_reasoning`` (see think.prompt_opens_reasoning).
REASONING_PARSERS: Final[frozenset[str]] = frozenset(
    {"qwen3", "deepseek_r1", "deepseek_v3", "glm45", "kimi", "kimi_k2", "minimax_m2", HARMONY_REASONING}
)


# What each format writes to leave its reasoning block for the answer, as its chat template renders a past
# turn (the newline some write before the end marker is reasoning text, not part of the close). When a
# reasoning budget runs out inside the block the gateway appends it and the model answers from there
# (node/pipeline/continuation.py). Harmony has no think block: not listed, its reasoning is not budgeted.
REASONING_CLOSE: Final[Mapping[str, str]] = {
    "qwen3": THINK_END + "\n\n",
    "deepseek_r1": THINK_END + "\n\n",
    "minimax_m2": THINK_END + "\n\n",
    "deepseek_v3": THINK_END,
    "kimi": THINK_END,
    "kimi_k2": THINK_END,
    "glm45": THINK_END + "\n",
}


class UnknownParserError(ValueError):
    """A parser name that is not in `TOOL_PARSERS` / `REASONING_PARSERS`."""


def build_parser(
    *,
    tool_parser: str | None = None,
    reasoning_parser: str | None = None,
    options: ToolOptions | None = None,
    in_reasoning: bool = False,
) -> StreamParser:
    """The parser for one choice: reasoning first, then tool calls in what remains content.

    ``options`` carries the request's tools (None: no tool list, any function name accepted).
    ``in_reasoning``: the prompt left a reasoning block open. Pass ``tool_parser=None`` when the request
    has no tools, so calls are not looked for.

    Raises:
        UnknownParserError: a name is not registered.
    """
    opts = options if options is not None else ToolOptions()
    if tool_parser is not None and tool_parser not in TOOL_PARSERS:
        raise UnknownParserError(f"unknown tool-call parser {tool_parser!r}; known: {', '.join(sorted(TOOL_PARSERS))}")
    if reasoning_parser is not None and reasoning_parser not in REASONING_PARSERS:
        known = ", ".join(sorted(REASONING_PARSERS))
        raise UnknownParserError(f"unknown reasoning parser {reasoning_parser!r}; known: {known}")
    if tool_parser == HARMONY_TOOLS or reasoning_parser == HARMONY_REASONING:
        return HarmonyParser(opts, parse_tools=tool_parser == HARMONY_TOOLS)
    reasoning = ThinkParser(in_reasoning=in_reasoning) if reasoning_parser is not None else None
    tools = TOOL_PARSERS[tool_parser](opts) if tool_parser is not None else None
    if reasoning is not None and tools is not None:
        return ChainedParser(reasoning, tools)
    return reasoning or tools or PlainParser()
