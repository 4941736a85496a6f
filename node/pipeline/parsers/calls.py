"""Turning a parsed tool call into events, and the rules every tool-call parser shares.

Two ways a call reaches the client:

- Streamed (the JSON families: Hermes/Qwen, Mistral ``[ARGS]``, DeepSeek V3/V3.1, Kimi K2, Harmony; see
  ``argstream.py``): ``ToolCallStart`` once the name is known and accepted and the arguments object begins,
  then ``ToolCallArgsDelta`` fragments of the model's own text as far as it stays a JSON-object prefix, then
  ``ToolCallEnd``. The fragments concatenate to the call's arguments exactly as written.
  Llama 3 JSON streams the same way; Qwen3-Coder and GLM-4.5 stream one closed parameter at a time
  (paramstream.py).
- Decided at close (pythonic lists, the Mistral JSON-list form, and any block whose head does not
  stream, e.g. ``"arguments"`` before ``"name"``): the block is held to its end marker (or the end of
  output), parsed and checked, and emitted as ``ToolCallStart, ToolCallArgsDelta, ToolCallEnd`` at once,
  its arguments as ``json.dumps`` writes them.

Degrade rule (before a call has started; one for all families): a call block becomes content, verbatim and
including its markers, when it is unfinished at the end of output, does not parse, has arguments that are not
a JSON object, names a function missing from the request's tool list (when one is given), or grows past
``max_call_chars``. Events cannot be taken back, so a *started* call is never undone: it ends where it is cut
(end of output: the arguments sent so far, as OpenAI ends a call cut by ``length``; the bound: where the bound
falls) or where its JSON breaks, and the text after that point is content (``argstream.py``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from node.pipeline.parsers.events import Event, ToolCallArgsDelta, ToolCallEnd, ToolCallStart

# A call block's text is held in memory until it closes (a streamed call's too: the bound keeps one rule for
# both paths, and a started call that reaches it ends there). 1 Mi characters is far beyond any real call's arguments
# (a 128k-token context is ~0.5 Mi characters) and bounds what one choice can make the gateway hold.
MAX_CALL_CHARS: Final = 1 << 20

JsonSchema = Mapping[str, object]


@dataclass(frozen=True, slots=True)
class ToolOptions:
    """What a tool-call parser knows about the request."""

    # Function name -> its parameters JSON schema. None: the request listed no tools, any name is accepted.
    tools: Mapping[str, JsonSchema] | None = None
    id_prefix: str = "call_"  # ids are id_prefix + call index unless the format carries its own
    max_call_chars: int = MAX_CALL_CHARS


@dataclass(frozen=True, slots=True)
class ParsedCall:
    name: str
    arguments: str  # a JSON object's text
    id: str | None = None  # the id the format itself carries (Kimi K2), else one is assigned


@dataclass(slots=True)
class CallEmitter:
    """Numbers calls and checks them against the tool list."""

    options: ToolOptions
    count: int = 0

    def accepts(self, calls: Sequence[ParsedCall]) -> bool:
        known = self.options.tools
        return bool(calls) and (known is None or all(call.name in known for call in calls))

    def accepts_name(self, name: str) -> bool:
        known = self.options.tools
        return known is None or name in known

    def start(self, name: str, call_id: str | None = None) -> ToolCallStart:
        """The next call's start (its index and id assigned here)."""
        index = self.count
        self.count += 1
        return ToolCallStart(index, call_id or f"{self.options.id_prefix}{index}", name)

    def emit(self, calls: Sequence[ParsedCall]) -> list[Event]:
        events: list[Event] = []
        for call in calls:
            start = self.start(call.name, call.id)
            events += (start, ToolCallArgsDelta(start.index, call.arguments), ToolCallEnd(start.index))
        return events

    def schema_type(self, function: str, parameter: str) -> str | None:
        """The JSON-schema ``type`` declared for ``parameter`` of ``function``, if the tool list says."""
        schema = (self.options.tools or {}).get(function, {})
        properties = schema.get("properties")
        prop = properties.get(parameter) if isinstance(properties, Mapping) else None
        kind = prop.get("type") if isinstance(prop, Mapping) else None
        return kind if isinstance(kind, str) else None


# What a model can write that json rejects: bad syntax, and nesting deeper than the interpreter's recursion
# limit (json recurses per level; "[" * 100_000 would otherwise escape as RecursionError).
_BAD_JSON: Final = (ValueError, RecursionError)


def arguments_text(value: object) -> str | None:
    """A call's arguments as JSON object text: an object, or a string holding one. None if neither."""
    try:
        if isinstance(value, str):
            value = json.loads(value) if value.strip() else {}
        if not isinstance(value, dict):
            return None
        return json.dumps(value, ensure_ascii=False)
    except _BAD_JSON:
        return None


def dumps_arguments(arguments: dict[str, object]) -> str | None:
    """``arguments`` (values built from a non-JSON format) as JSON object text, or None if it cannot be."""
    try:
        return json.dumps(arguments, ensure_ascii=False, allow_nan=False)
    except (TypeError, *_BAD_JSON):  # TypeError: a value JSON cannot hold (a set, bytes, a complex number)
        return None


def call_from_object(value: object, *, args_keys: tuple[str, ...] = ("arguments", "parameters")) -> ParsedCall | None:
    """``{"name": ..., "arguments"|"parameters": {...}}`` as a call, or None."""
    if not isinstance(value, dict):
        return None
    name = value.get("name")
    if not isinstance(name, str) or not name:
        return None
    raw: object = next((value[key] for key in args_keys if key in value), {})
    arguments = arguments_text(raw)
    return ParsedCall(name, arguments) if arguments is not None else None


def typed_value(raw: str, schema_type: str | None, *, guess: bool) -> object:
    """A parameter written as bare text (XML-style formats) as a JSON value.

    A declared ``string`` stays text; another declared type is parsed as JSON. With no declared type the
    value stays text unless ``guess`` (then JSON if it parses). Text that fails to parse stays text.
    """
    if schema_type == "string" or (schema_type is None and not guess):
        return raw
    try:
        return json.loads(raw)
    except _BAD_JSON:
        return raw


def decode_json_objects(text: str, separators: str = "") -> list[object] | None:
    """Consecutive JSON values in ``text`` separated by whitespace or ``separators`` characters, or None if
    anything else is found."""
    decoder = json.JSONDecoder()
    values: list[object] = []
    pos, size = 0, len(text)
    skip = " \t\r\n" + separators
    while True:
        while pos < size and text[pos] in skip:
            pos += 1
        if pos == size:
            return values
        try:
            value, pos = decoder.raw_decode(text, pos)
        except _BAD_JSON:
            return None
        values.append(value)
