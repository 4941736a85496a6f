"""Tool calls the engine was constrained to write (``tool_choice`` a named function or ``required``), as vLLM
constrains them: not the family's markup but bare JSON.

- A named function: the whole output is that function's arguments object. It streams: the call starts with
  the first output text and every piece is an argument fragment (as OpenAI streams a forced call).
- ``required``: the output is a JSON array of ``{"name": ..., "parameters": {...}}`` objects. It is held
  until the end of output and parsed once; anything else (a truncated array, an unknown name) degrades to
  content verbatim, as the family parsers do (node/pipeline/parsers/calls.py).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from node.pipeline.parsers.calls import CallEmitter, ParsedCall, ToolOptions, arguments_text
from node.pipeline.parsers.events import ContentDelta, Event, ToolCallArgsDelta, ToolCallEnd, ToolCallStart


class NamedCallParser:
    """The output is the arguments of ``name``'s one call."""

    __slots__ = ("_id", "_name", "_started")

    def __init__(self, name: str, options: ToolOptions) -> None:
        self._name = name
        self._id = f"{options.id_prefix}0"
        self._started = False

    def feed(self, text: str, token_ids: Sequence[int] = ()) -> list[Event]:
        out: list[Event] = []
        if not self._started:
            # Whitespace before the JSON (after a reasoning block, say) is not part of the arguments.
            text = text.lstrip()
            if not text:
                return []
            self._started = True
            out.append(ToolCallStart(0, self._id, self._name))
        if text:
            out.append(ToolCallArgsDelta(0, text))
        return out

    def finish(self) -> list[Event]:
        if not self._started:  # no output at all: a call with no arguments
            self._started = True
            return [ToolCallStart(0, self._id, self._name), ToolCallArgsDelta(0, "{}"), ToolCallEnd(0)]
        return [ToolCallEnd(0)]


class RequiredCallsParser:
    """The output is a JSON array of calls, parsed when it ends."""

    __slots__ = ("_buf", "_emitter", "_overflow")

    def __init__(self, options: ToolOptions) -> None:
        self._emitter = CallEmitter(options)
        self._buf: list[str] = []
        self._overflow = 0  # characters held; past the bound the output is content

    def feed(self, text: str, token_ids: Sequence[int] = ()) -> list[Event]:
        if self._overflow < 0:  # already degraded: pass through
            return [ContentDelta(text)] if text else []
        self._buf.append(text)
        self._overflow += len(text)
        if self._overflow > self._emitter.options.max_call_chars:
            held = "".join(self._buf)
            self._buf.clear()
            self._overflow = -1
            return [ContentDelta(held)] if held else []
        return []

    def finish(self) -> list[Event]:
        if self._overflow < 0:
            return []
        text = "".join(self._buf)
        self._buf.clear()
        calls = _calls(text)
        if calls is not None and self._emitter.accepts(calls):
            return self._emitter.emit(calls)
        return [ContentDelta(text)] if text else []


def _calls(text: str) -> list[ParsedCall] | None:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, list):
        return None
    calls = []
    for entry in value:
        if not isinstance(entry, dict) or not isinstance(name := entry.get("name"), str) or not name:
            return None
        arguments = arguments_text(entry.get("parameters", entry.get("arguments", {})))
        if arguments is None:
            return None
        calls.append(ParsedCall(name, arguments))
    return calls
