"""Mistral tool calls after ``[TOOL_CALLS]``, in either published form:

- a JSON list (tokenizer versions before v11): ``[TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]``
- one call per marker (v11 and later): ``[TOOL_CALLS]f[ARGS]{...}`` (optionally ``f[CALL_ID]id[ARGS]{...}``)

There is no end marker: a call runs to the next ``[TOOL_CALLS]`` or to the end of output (the calls end a
Mistral reply; ``</s>`` is the stop token).
"""

from __future__ import annotations

import re
from typing import Final

from node.pipeline.parsers.argstream import StreamRule
from node.pipeline.parsers.blocks import BlockFormat, BlockToolParser
from node.pipeline.parsers.calls import (
    CallEmitter,
    ParsedCall,
    ToolOptions,
    arguments_text,
    call_from_object,
    decode_json_objects,
)

_V11: Final = re.compile(r"\s*([^\s\[\]{]+)(?:\[CALL_ID\][^\[]*)?\[ARGS\](.*)", re.DOTALL)


def parse_mistral(block: str, emitter: CallEmitter) -> list[ParsedCall] | None:
    if block.lstrip().startswith("["):
        values = decode_json_objects(block)
        if values is None or len(values) != 1 or not isinstance(values[0], list):
            return None
        calls = [call_from_object(item) for item in values[0]]
        return [call for call in calls if call is not None] if all(calls) else None
    match = _V11.fullmatch(block)
    if match is None:
        return None
    arguments = arguments_text(match.group(2))
    return [ParsedCall(match.group(1), arguments)] if arguments is not None else None


# The v11 form streams; the JSON-list form is decided whole when its block ends.
_STREAM = StreamRule(
    head=re.compile(r"\s*(?P<name>[^\s\[\]{]+)(?:\[CALL_ID\][^\[]*)?\[ARGS\]\s*\{"), trailer=re.compile(r"\s*")
)
MISTRAL = BlockFormat(call_begin="[TOOL_CALLS]", call_end=None, parse=parse_mistral, stream=_STREAM)


def mistral_parser(options: ToolOptions) -> BlockToolParser:
    return BlockToolParser(MISTRAL, options)
