"""GLM-4.5 tool calls::

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Beijing</arg_value>
    </tool_call>

A value becomes a JSON value by the type the tool list declares (``string`` stays text); undeclared values
are JSON when they parse and text otherwise, as GLM's published parser does. A call streams one parameter at
a time from its first ``<arg_key>`` (paramstream.py).
"""

from __future__ import annotations

from node.pipeline.parsers.blocks import BlockFormat, BlockToolParser
from node.pipeline.parsers.calls import CallEmitter, ParsedCall, ToolOptions, dumps_arguments, typed_value
from node.pipeline.parsers.paramstream import GLM45 as STREAM
from node.pipeline.parsers.paramstream import ParamStream
from node.pipeline.parsers.tags import tagged_runs


def _pairs(block: str, pos: int) -> list[tuple[str, str]] | None:
    """``<arg_key>K</arg_key> <arg_value>V</arg_value>`` pairs from ``pos``, only whitespace around them;
    None if anything else is found. Key and value runs are read alternately with str.find (see tags.py)."""
    pairs: list[tuple[str, str]] = []
    while True:
        key = tagged_runs(block, pos, "<arg_key>", "", "</arg_key>", limit=1)
        if not key:  # None: not this format; []: only whitespace left
            return None if key is None else pairs
        pos = block.index("</arg_key>", block.index("<arg_key>", pos)) + len("</arg_key>")
        value = tagged_runs(block, pos, "<arg_value>", "", "</arg_value>", limit=1)
        if not value:
            return None
        pos = block.index("</arg_value>", block.index("<arg_value>", pos)) + len("</arg_value>")
        pairs.append((key[0][1], value[0][1]))


def parse_glm45(block: str, emitter: CallEmitter) -> list[ParsedCall] | None:
    first = block.find("<arg_key>")
    name = (block if first < 0 else block[:first]).strip()
    if not name or "<" in name or "\n" in name:
        return None
    pairs = _pairs(block, len(block) if first < 0 else first)
    if pairs is None:
        return None
    arguments: dict[str, object] = {}
    for key, value in pairs:
        arguments[key.strip()] = typed_value(value, emitter.schema_type(name, key.strip()), guess=True)
    encoded = dumps_arguments(arguments)
    return [ParsedCall(name, encoded)] if encoded is not None else None


GLM45 = BlockFormat(
    call_begin="<tool_call>", call_end="</tool_call>", parse=parse_glm45, stream=lambda: ParamStream(STREAM)
)


def glm45_parser(options: ToolOptions) -> BlockToolParser:
    return BlockToolParser(GLM45, options)
