"""Pythonic tool calls (Llama 3.2 / Llama 4): the whole reply is a Python list of calls with keyword
arguments, ``[get_weather(city="Paris"), get_time(tz="CET")]``, optionally wrapped in Llama 4's
``<|python_start|>…<|python_end|>``. Argument values must be Python literals; they become JSON."""

from __future__ import annotations

import ast
from typing import Final

from node.pipeline.parsers.calls import CallEmitter, ParsedCall, ToolOptions, dumps_arguments
from node.pipeline.parsers.whole import WholeOutputToolParser

PYTHON_START: Final = "<|python_start|>"
PYTHON_END: Final = "<|python_end|>"


def _name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        owner = _name(func.value)
        return f"{owner}.{func.attr}" if owner else None
    return None


def parse_pythonic(text: str, emitter: CallEmitter) -> list[ParsedCall] | None:
    source = text.strip().removeprefix(PYTHON_START).removesuffix(PYTHON_END).strip()
    try:
        tree = ast.parse(source, mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    if not isinstance(tree.body, ast.List):
        return None
    calls: list[ParsedCall] = []
    for node in tree.body.elts:
        name = _name(node.func) if isinstance(node, ast.Call) else None
        if name is None or not isinstance(node, ast.Call) or node.args:
            return None
        arguments: dict[str, object] = {}
        for keyword in node.keywords:
            if keyword.arg is None:
                return None
            try:
                arguments[keyword.arg] = ast.literal_eval(keyword.value)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                return None
        encoded = dumps_arguments(arguments)
        if encoded is None:
            return None
        calls.append(ParsedCall(name, encoded))
    return calls


def pythonic_parser(options: ToolOptions) -> WholeOutputToolParser:
    return WholeOutputToolParser(("[", PYTHON_START), parse_pythonic, options)
