"""Llama 3.x JSON tool calls: the whole reply is ``{"name": "f", "parameters": {...}}`` (``"arguments"``
accepted too), optionally after ``<|python_tag|>``, several calls separated by ``;``."""

from __future__ import annotations

import re
from typing import Final

from node.pipeline.parsers.argstream import StreamRule
from node.pipeline.parsers.calls import CallEmitter, ParsedCall, ToolOptions, call_from_object, decode_json_objects
from node.pipeline.parsers.whole import WholeOutputToolParser

PYTHON_TAG: Final = "<|python_tag|>"


def parse_llama3_json(text: str, emitter: CallEmitter) -> list[ParsedCall] | None:
    values = decode_json_objects(text.strip().removeprefix(PYTHON_TAG), separators=";")
    if not values:
        return None
    calls = [call_from_object(value, args_keys=("parameters", "arguments")) for value in values]
    return [call for call in calls if call is not None] if all(calls) else None


# A call streams when "name" (a plain string) comes first and its arguments are an object; it ends at the
# wrapper's "}". Other shapes are held and parsed when the output ends.
_CALL = r'\{\s*"name"\s*:\s*"(?P<name>[^"\\\x00-\x1f]*)"\s*,\s*"(?:parameters|arguments)"\s*:\s*\{'
_FIRST = StreamRule(re.compile(r"\s*(?:<\|python_tag\|>)?\s*" + _CALL), re.compile(r"\s*"), closer="}")
_NEXT = StreamRule(re.compile(r"[\s;]*" + _CALL), re.compile(r"\s*"), closer="}")


def llama3_json_parser(options: ToolOptions) -> WholeOutputToolParser:
    return WholeOutputToolParser((PYTHON_TAG, "{"), parse_llama3_json, options, stream=(_FIRST, _NEXT))
