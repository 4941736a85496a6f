"""Llama 3.x JSON tool calls: the whole reply is ``{"name": "f", "parameters": {...}}`` (``"arguments"``
accepted too), optionally after ``<|python_tag|>``, several calls separated by ``;``."""

from __future__ import annotations

from typing import Final

from node.pipeline.parsers.calls import CallEmitter, ParsedCall, ToolOptions, call_from_object, decode_json_objects
from node.pipeline.parsers.whole import WholeOutputToolParser

PYTHON_TAG: Final = "<|python_tag|>"


def parse_llama3_json(text: str, emitter: CallEmitter) -> list[ParsedCall] | None:
    values = decode_json_objects(text.strip().removeprefix(PYTHON_TAG), separators=";")
    if not values:
        return None
    calls = [call_from_object(value, args_keys=("parameters", "arguments")) for value in values]
    return [call for call in calls if call is not None] if all(calls) else None


def llama3_json_parser(options: ToolOptions) -> WholeOutputToolParser:
    return WholeOutputToolParser((PYTHON_TAG, "{"), parse_llama3_json, options)
