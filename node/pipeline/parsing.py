"""Which output parsers a model and a request get: the model's parsers (chosen by name or detected from its
folder, once at load) and one choice's plan (the request's tools, whether the prompt left reasoning open).

Special tokens: tokenizers often mark a format's delimiters special (Llama 3.1's ``<|python_tag|>``,
Harmony's ``<|channel|>``). The client's ``skip_special_tokens`` would drop them before the parser saw them,
so the model keeps the ids of the special tokens its parsers match (``keep_ids``): the detokenizer decodes
those and still skips every other special token. What reaches the client is what the parser leaves as
content, without the markers it consumed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from node.pipeline.detokenize import IncrementalDetokenizer
from node.pipeline.parsers import deepseek, harmony, kimi_k2, llama3_json, pythonic, think
from node.pipeline.parsers.calls import JsonSchema
from node.pipeline.parsers.registry import REASONING_CLOSE, REASONING_PARSERS, TOOL_PARSERS, UnknownParserError
from node.pipeline.request import NamedTool
from node.pipeline.tokenizer import Tokenizer

#: The parser setting that means "detect from the model folder" and the one that means "no parser".
AUTO: Final = "auto"
NONE: Final = "none"

# Delimiters a tokenizer may hold as special tokens, per parser name (formats whose delimiters are plain
# text, such as ``<tool_call>``, need nothing kept).
_HARMONY: Final = (harmony.START, harmony.CHANNEL, harmony.MESSAGE, *harmony.BODY_ENDS)
_MARKERS: Final[Mapping[str, tuple[str, ...]]] = {
    "llama3_json": (llama3_json.PYTHON_TAG,),
    "llama4_json": (llama3_json.PYTHON_TAG,),
    "pythonic": (pythonic.PYTHON_START, pythonic.PYTHON_END),
    "llama4_pythonic": (pythonic.PYTHON_START, pythonic.PYTHON_END),
    "deepseek_v3": (deepseek.CALLS_BEGIN, deepseek.CALLS_END, deepseek.CALL_BEGIN, deepseek.CALL_END, deepseek.SEP),
    "deepseek_v31": (deepseek.CALLS_BEGIN, deepseek.CALLS_END, deepseek.CALL_BEGIN, deepseek.CALL_END, deepseek.SEP),
    "mistral": ("[TOOL_CALLS]", "[CALL_ID]", "[ARGS]"),
    "kimi_k2": (
        kimi_k2.KIMI_K2.call_begin,
        kimi_k2.KIMI_K2.call_end or "",
        kimi_k2.KIMI_K2.section_begin or "",
        kimi_k2.KIMI_K2.section_end or "",
        "<|tool_call_argument_begin|>",
    ),
    "openai": _HARMONY,
    "gpt_oss": _HARMONY,
}
_THINK_MARKERS: Final = (think.THINK_START, think.THINK_END)

# How many of the prompt's last ids are decoded to see whether the template opened a reasoning block: a
# template that opens one writes ``<think>`` and at most a newline after it.
PROMPT_TAIL_IDS: Final = 8


@dataclass(frozen=True, slots=True)
class ModelParsers:
    """A served model's output parsers (vLLM's names; None: none), resolved once at load."""

    tool_parser: str | None = None
    reasoning_parser: str | None = None
    # Special token ids the parsers match: decoded even when the client skips special tokens.
    keep_ids: frozenset[int] = frozenset()
    # The ids of ``<think>`` and ``</think>`` when each is one token (counts reasoning tokens by id).
    think_ids: tuple[int, int] | None = None
    # The family's close of the reasoning block (registry.REASONING_CLOSE) as ids, starting with the end id;
    # empty when reasoning is not counted by id or the family has none: a budget then cuts, not closes.
    think_close_ids: tuple[int, ...] = ()


def resolve_parsers(
    tokenizer: Tokenizer, *, tool: str, reasoning: str, detected_tool: str | None, detected_reasoning: str | None
) -> ModelParsers:
    """The model's parsers from the configured names (``auto``: the detected one; ``none``: no parser).

    Raises:
        UnknownParserError: a name is not registered (a ValueError: the node refuses to start).
    """
    tool_parser = detected_tool if tool == AUTO else None if tool == NONE else tool
    reasoning_parser = detected_reasoning if reasoning == AUTO else None if reasoning == NONE else reasoning
    if tool_parser is not None and tool_parser not in TOOL_PARSERS:
        known = ", ".join(sorted(TOOL_PARSERS))
        raise UnknownParserError(f"unknown tool-call parser {tool_parser!r}; known: {known}, auto, none")
    if reasoning_parser is not None and reasoning_parser not in REASONING_PARSERS:
        known = ", ".join(sorted(REASONING_PARSERS))
        raise UnknownParserError(f"unknown reasoning parser {reasoning_parser!r}; known: {known}, auto, none")
    markers = set(_MARKERS.get(tool_parser or "", ()))
    markers |= set(_MARKERS.get(reasoning_parser or "", _THINK_MARKERS if reasoning_parser else ()))
    special = tokenizer.special_token_ids
    keep = frozenset(i for m in markers if (i := tokenizer.token_to_id(m)) is not None and i in special)
    think_ids = None
    if reasoning_parser is not None and reasoning_parser not in _MARKERS:
        start, end = tokenizer.token_to_id(think.THINK_START), tokenizer.token_to_id(think.THINK_END)
        think_ids = (start, end) if start is not None and end is not None else None
    close: tuple[int, ...] = ()
    close_text = REASONING_CLOSE.get(reasoning_parser or "")
    if think_ids is not None and close_text is not None:
        close = tuple(tokenizer.encode(close_text, add_special_tokens=False))
        close = close if close and close[0] == think_ids[1] else ()  # the counter must see the block end
    return ModelParsers(tool_parser, reasoning_parser, keep, think_ids, close)


@dataclass(frozen=True, slots=True)
class ParserPlan:
    """One request's parsers, the same for each of its choices (each builds its own parser from it)."""

    tool_parser: str | None
    reasoning_parser: str | None
    # Function name -> parameters schema of the tools offered (None: no tool list, any name accepted).
    tools: Mapping[str, JsonSchema] | None = None
    # The prompt left a reasoning block open: the output starts inside it.
    in_reasoning: bool = False
    # At most this many calls are kept per choice (parallel_tool_calls=false: 1); None: all.
    max_calls: int | None = None
    keep_ids: frozenset[int] = frozenset()
    think_ids: tuple[int, int] | None = None
    # The engine was constrained to call (tool_choice required / a named function): the answer is bare JSON
    # (node/pipeline/parsers/forced.py), not the family's markup. None: the family's tool-call parser.
    forced: Literal["required"] | NamedTool | None = None
    # At most this many reasoning tokens (counted by ``think_ids``; GenerateRequest.reasoning_budget). None:
    # uncapped. A choice still reasoning then has its block closed with ``think_close_ids`` and answers on
    # (node/pipeline/continuation.py), or ends "length" when it cannot be (no close ids, n > 1, no room).
    think_budget: int | None = None
    think_close_ids: tuple[int, ...] = ()


class KeepingDetokenizer:
    """An IncrementalDetokenizer that decodes special tokens but drops those not in ``keep``: the client's
    skip_special_tokens for every special token but the parsers' delimiters."""

    __slots__ = ("_drop", "_inner")

    def __init__(self, tokenizer: Tokenizer, keep: frozenset[int], prompt_ids: Sequence[int] = ()) -> None:
        self._drop = tokenizer.special_token_ids - keep
        drop = self._drop
        self._inner = IncrementalDetokenizer(
            tokenizer.raw, skip_special_tokens=False, prompt_ids=[t for t in prompt_ids if t not in drop]
        )

    def step(self, ids: Sequence[int]) -> str:
        drop = self._drop
        return self._inner.step([t for t in ids if t not in drop])

    def finish(self) -> str:
        return self._inner.finish()


class ThinkCounter:
    """Counts the generated ids inside the reasoning block (between the ``<think>`` and ``</think>`` ids,
    the markers excluded), as ``usage.completion_tokens_details.reasoning_tokens``. Id-based, so any
    chunking counts the same."""

    __slots__ = ("_end", "_start", "_state", "count")

    def __init__(self, think_ids: tuple[int, int], *, in_reasoning: bool) -> None:
        self._start, self._end = think_ids
        self._state = 1 if in_reasoning else 0  # 0 before the block, 1 inside, 2 after
        self.count = 0

    @property
    def done(self) -> bool:
        """The block is behind (or will never come): no later id counts."""
        return self._state == 2

    def feed(self, ids: Sequence[int]) -> None:
        state = self._state
        if state == 2:
            return
        for token in ids:
            if state == 0:
                # Content first means the model answered without thinking: no block will follow.
                state = 1 if token == self._start else 2
            elif token == self._end:
                state = 2
            else:
                self.count += 1
            if state == 2:
                break
        self._state = state
