"""Qwen3-Coder XML tool calls::

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

A parameter's value is its text without one leading and one trailing newline; it becomes a JSON value by
the type the tool list declares for it (a string when undeclared), as Qwen's own parser does. A call streams
one parameter at a time (paramstream.py).
"""

from __future__ import annotations

from typing import Final

from node.pipeline.parsers.blocks import BlockFormat, BlockToolParser
from node.pipeline.parsers.calls import CallEmitter, ParsedCall, ToolOptions, dumps_arguments, typed_value
from node.pipeline.parsers.paramstream import QWEN3_CODER as STREAM
from node.pipeline.parsers.paramstream import ParamStream
from node.pipeline.parsers.tags import tagged_runs

_FUNCTION_OPEN: Final = "<function="
_FUNCTION_CLOSE: Final = "</function>"


def parse_qwen3_coder(block: str, emitter: CallEmitter) -> list[ParsedCall] | None:
    body = block.strip()
    if not body.startswith(_FUNCTION_OPEN) or not body.endswith(_FUNCTION_CLOSE):
        return None
    name_end = body.find(">")
    name = body[len(_FUNCTION_OPEN) : name_end].strip()
    if not name or "\n" in name or "<" in name:
        return None
    params = tagged_runs(body[: -len(_FUNCTION_CLOSE)], name_end + 1, "<parameter=", ">", "</parameter>")
    if params is None:
        return None
    arguments: dict[str, object] = {}
    for key, value in params:
        text = value.removeprefix("\n").removesuffix("\n")
        arguments[key.strip()] = typed_value(text, emitter.schema_type(name, key.strip()), guess=False)
    encoded = dumps_arguments(arguments)
    return [ParsedCall(name, encoded)] if encoded is not None else None


QWEN3_CODER = BlockFormat(
    call_begin="<tool_call>", call_end="</tool_call>", parse=parse_qwen3_coder, stream=lambda: ParamStream(STREAM)
)


def qwen3_coder_parser(options: ToolOptions) -> BlockToolParser:
    return BlockToolParser(QWEN3_CODER, options)
