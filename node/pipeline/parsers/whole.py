"""The engine for formats where the whole output is the calls (Llama 3.x JSON, pythonic lists).

These formats have no end marker: a reply is calls when it *starts* with an opener (after whitespace),
e.g. ``{`` or ``<|python_tag|>``; the calls are parsed at the end of output. Any other reply is decided to
be content at its first non-opener character and streams through from then on at no cost. A reply that
starts like calls but does not parse is content, verbatim.
"""

from __future__ import annotations

from collections.abc import Sequence

from node.pipeline.parsers.blocks import BlockParse
from node.pipeline.parsers.calls import CallEmitter, ToolOptions
from node.pipeline.parsers.events import ContentDelta, Event

_UNDECIDED, _CALLS, _CONTENT = 0, 1, 2


class WholeOutputToolParser:
    __slots__ = ("_buf", "_calls", "_max", "_openers", "_parse", "_state")

    def __init__(self, openers: Sequence[str], parse: BlockParse, options: ToolOptions) -> None:
        self._openers = tuple(openers)
        self._parse = parse
        self._calls = CallEmitter(options)
        self._max = options.max_call_chars
        self._state = _UNDECIDED
        self._buf = ""

    def feed(self, text: str, token_ids: Sequence[int] = ()) -> list[Event]:
        if self._state == _CONTENT:
            return [ContentDelta(text)] if text else []
        self._buf += text
        if self._state == _UNDECIDED:
            head = self._buf.lstrip()
            if not head or any(opener.startswith(head) for opener in self._openers):
                return []  # only whitespace or part of an opener so far
            self._state = _CALLS if head.startswith(self._openers) else _CONTENT
        if self._state == _CONTENT or len(self._buf) > self._max:
            self._state = _CONTENT
            text, self._buf = self._buf, ""
            return [ContentDelta(text)]
        return []

    def finish(self) -> list[Event]:
        text, self._buf = self._buf, ""
        if self._state == _CALLS:
            calls = self._parse(text, self._calls)
            if calls is not None and self._calls.accepts(calls):
                return self._calls.emit(calls)
        return [ContentDelta(text)] if text else []
