"""Kimi K2 tool calls::

    <|tool_calls_section_begin|>
    <|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|>
    <|tool_calls_section_end|>

The call id (``functions.get_weather:0``) is the model's own and is kept as the call's id; the function
name is the part between ``functions.`` and ``:``.
"""

from __future__ import annotations

import re
from typing import Final

from node.pipeline.parsers.argstream import StreamRule
from node.pipeline.parsers.blocks import BlockFormat, BlockToolParser
from node.pipeline.parsers.calls import CallEmitter, ParsedCall, ToolOptions, arguments_text

_CALL: Final = re.compile(r"\s*((?:functions\.)?([^\s:<]+):\d+)\s*<\|tool_call_argument_begin\|>(.*)", re.DOTALL)


def parse_kimi_k2(block: str, emitter: CallEmitter) -> list[ParsedCall] | None:
    match = _CALL.fullmatch(block)
    if match is None:
        return None
    arguments = arguments_text(match.group(3))
    return [ParsedCall(match.group(2), arguments, match.group(1))] if arguments is not None else None


KIMI_K2 = BlockFormat(
    call_begin="<|tool_call_begin|>",
    call_end="<|tool_call_end|>",
    parse=parse_kimi_k2,
    section_begin="<|tool_calls_section_begin|>",
    section_end="<|tool_calls_section_end|>",
    stream=StreamRule(
        head=re.compile(r"\s*(?P<id>(?:functions\.)?(?P<name>[^\s:<]+):\d+)\s*<\|tool_call_argument_begin\|>\s*\{"),
        trailer=re.compile(r"\s*"),
    ),
)


def kimi_k2_parser(options: ToolOptions) -> BlockToolParser:
    return BlockToolParser(KIMI_K2, options)
