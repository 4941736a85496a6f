"""Hermes / Qwen 2.5–3 tool calls: ``<tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>``,
one JSON object per block, blocks repeated for parallel calls."""

from __future__ import annotations

import re

from node.pipeline.parsers.argstream import StreamRule
from node.pipeline.parsers.blocks import BlockFormat, BlockToolParser
from node.pipeline.parsers.calls import CallEmitter, ParsedCall, ToolOptions, call_from_object, decode_json_objects


def parse_hermes(block: str, emitter: CallEmitter) -> list[ParsedCall] | None:
    values = decode_json_objects(block)
    if values is None or len(values) != 1:
        return None
    call = call_from_object(values[0])
    return [call] if call is not None else None


# Streams when "name" (a plain string) comes first and the arguments are an object; any other shape (keys the
# other way round, an escaped name, arguments as a JSON string) is decided whole at </tool_call>.
HERMES_STREAM = StreamRule(
    head=re.compile(r'\s*\{\s*"name"\s*:\s*"(?P<name>[^"\\\x00-\x1f]*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*\{'),
    trailer=re.compile(r"\s*\}\s*"),
)
HERMES = BlockFormat(call_begin="<tool_call>", call_end="</tool_call>", parse=parse_hermes, stream=HERMES_STREAM)


def hermes_parser(options: ToolOptions) -> BlockToolParser:
    return BlockToolParser(HERMES, options)
