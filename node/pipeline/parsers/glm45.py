"""GLM-4.5 tool calls::

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Beijing</arg_value>
    </tool_call>

A value becomes a JSON value by the type the tool list declares (``string`` stays text); undeclared values
are JSON when they parse and text otherwise, as GLM's published parser does.
"""

from __future__ import annotations

import json
import re
from typing import Final

from node.pipeline.parsers.blocks import BlockFormat, BlockToolParser
from node.pipeline.parsers.calls import CallEmitter, ParsedCall, ToolOptions, typed_value

_ARG: Final = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


def parse_glm45(block: str, emitter: CallEmitter) -> list[ParsedCall] | None:
    first = block.find("<arg_key>")
    name = (block if first < 0 else block[:first]).strip()
    if not name or "<" in name or "\n" in name:
        return None
    arguments: dict[str, object] = {}
    pos = max(first, 0) if first >= 0 else len(block)
    for arg in _ARG.finditer(block, pos):
        if block[pos : arg.start()].strip():
            return None
        pos = arg.end()
        key = arg.group(1).strip()
        arguments[key] = typed_value(arg.group(2), emitter.schema_type(name, key), guess=True)
    if block[pos:].strip():
        return None
    return [ParsedCall(name, json.dumps(arguments, ensure_ascii=False))]


GLM45 = BlockFormat(call_begin="<tool_call>", call_end="</tool_call>", parse=parse_glm45)


def glm45_parser(options: ToolOptions) -> BlockToolParser:
    return BlockToolParser(GLM45, options)
