"""DeepSeek tool calls, in a section ``<｜tool▁calls▁begin｜>…<｜tool▁calls▁end｜>`` of one or more calls.

- V3 (``deepseek_v3``): ``<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\nARGS\\n```<｜tool▁call▁end｜>``
- V3.1 (``deepseek_v31``): ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>``
"""

from __future__ import annotations

import re
from typing import Final

from node.pipeline.parsers.argstream import StreamRule
from node.pipeline.parsers.blocks import BlockFormat, BlockToolParser
from node.pipeline.parsers.calls import CallEmitter, ParsedCall, ToolOptions, arguments_text

CALLS_BEGIN: Final = "<｜tool▁calls▁begin｜>"
CALLS_END: Final = "<｜tool▁calls▁end｜>"
CALL_BEGIN: Final = "<｜tool▁call▁begin｜>"
CALL_END: Final = "<｜tool▁call▁end｜>"
SEP: Final = "<｜tool▁sep｜>"

_V3: Final = re.compile(r"\s*function" + SEP + r"([^\n<]+)\n```(?:json)?\n(.*)\n```\s*", re.DOTALL)


def _call(match: re.Match[str] | None) -> list[ParsedCall] | None:
    if match is None:
        return None
    name, arguments = match.group(1).strip(), arguments_text(match.group(2))
    return [ParsedCall(name, arguments)] if name and arguments is not None else None


def parse_v3(block: str, emitter: CallEmitter) -> list[ParsedCall] | None:
    return _call(_V3.fullmatch(block))


def parse_v31(block: str, emitter: CallEmitter) -> list[ParsedCall] | None:
    # partition, not a regex: a lazy name pattern followed by \s* backtracks quadratically on long blanks.
    name, sep, arguments = block.partition(SEP)
    name = name.strip()
    if not sep or not name or "\n" in name or "<" in name:
        return None
    encoded = arguments_text(arguments)
    return [ParsedCall(name, encoded)] if encoded is not None else None


# Heads as the parsers above read them, through the arguments' "{" (names stripped: a name ends at its last
# non-blank character before the newline / separator).
_V3_STREAM = StreamRule(
    head=re.compile(r"\s*function" + SEP + r"[^\S\n]*(?P<name>[^\n<]*[^\s<])[^\S\n]*\n```(?:json)?\n\s*\{"),
    trailer=re.compile(r"\s*```\s*"),
)
_V31_STREAM = StreamRule(
    head=re.compile(r"\s*(?P<name>[^\n<]*[^\s<])[^\S\n]*" + SEP + r"\s*\{"), trailer=re.compile(r"\s*")
)
DEEPSEEK_V3 = BlockFormat(CALL_BEGIN, CALL_END, parse_v3, CALLS_BEGIN, CALLS_END, _V3_STREAM)
DEEPSEEK_V31 = BlockFormat(CALL_BEGIN, CALL_END, parse_v31, CALLS_BEGIN, CALLS_END, _V31_STREAM)


def deepseek_v3_parser(options: ToolOptions) -> BlockToolParser:
    return BlockToolParser(DEEPSEEK_V3, options)


def deepseek_v31_parser(options: ToolOptions) -> BlockToolParser:
    return BlockToolParser(DEEPSEEK_V31, options)
