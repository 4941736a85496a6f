"""Hermes / Qwen 2.5–3 tool calls: ``<tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>``,
one JSON object per block, blocks repeated for parallel calls."""

from __future__ import annotations

from node.pipeline.parsers.blocks import BlockFormat, BlockToolParser
from node.pipeline.parsers.calls import CallEmitter, ParsedCall, ToolOptions, call_from_object, decode_json_objects


def parse_hermes(block: str, emitter: CallEmitter) -> list[ParsedCall] | None:
    values = decode_json_objects(block)
    if values is None or len(values) != 1:
        return None
    call = call_from_object(values[0])
    return [call] if call is not None else None


HERMES = BlockFormat(call_begin="<tool_call>", call_end="</tool_call>", parse=parse_hermes)


def hermes_parser(options: ToolOptions) -> BlockToolParser:
    return BlockToolParser(HERMES, options)
