"""Qwen3-Coder XML tool calls::

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

A parameter's value is its text without one leading and one trailing newline; it becomes a JSON value by
the type the tool list declares for it (a string when undeclared), as Qwen's own parser does.
"""

from __future__ import annotations

import json
import re
from typing import Final

from node.pipeline.parsers.blocks import BlockFormat, BlockToolParser
from node.pipeline.parsers.calls import CallEmitter, ParsedCall, ToolOptions, typed_value

_FUNCTION: Final = re.compile(r"\s*<function=([^>\n]+)>(.*)</function>\s*", re.DOTALL)
_PARAMETER: Final = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)


def parse_qwen3_coder(block: str, emitter: CallEmitter) -> list[ParsedCall] | None:
    function = _FUNCTION.fullmatch(block)
    if function is None:
        return None
    name, body = function.group(1).strip(), function.group(2)
    arguments: dict[str, object] = {}
    pos = 0
    for param in _PARAMETER.finditer(body):
        if body[pos : param.start()].strip():
            return None  # text outside a parameter: not this format
        pos = param.end()
        key, value = param.group(1).strip(), param.group(2)
        value = value.removeprefix("\n").removesuffix("\n")
        arguments[key] = typed_value(value, emitter.schema_type(name, key), guess=False)
    if body[pos:].strip() or not name:
        return None
    return [ParsedCall(name, json.dumps(arguments, ensure_ascii=False))]


QWEN3_CODER = BlockFormat(call_begin="<tool_call>", call_end="</tool_call>", parse=parse_qwen3_coder)


def qwen3_coder_parser(options: ToolOptions) -> BlockToolParser:
    return BlockToolParser(QWEN3_CODER, options)
