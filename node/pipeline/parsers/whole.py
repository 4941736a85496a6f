"""The engine for formats where the whole output is the calls (Llama 3.x JSON, pythonic lists).

These formats have no end marker: a reply is calls when it *starts* with an opener (after whitespace),
e.g. ``{`` or ``<|python_tag|>``; the calls are parsed at the end of output. Any other reply is decided to
be content at its first non-opener character and streams through from then on at no cost. A reply that
starts like calls but does not parse is content, verbatim.

Formats given a pair of `StreamRule`s (Llama 3 JSON: one for the first call, one for a call after ``;``)
stream each call's arguments (argstream.py): a call ends at its wrapper's ``}``, the next may follow. Text
after the last streamed call that is not a call is content, verbatim; a call that breaks makes the rest of
the output content. ``max_call_chars`` bounds the text held since the last call ended: a started call ends
there, text not yet a call becomes content.
"""

from __future__ import annotations

from collections.abc import Sequence

from node.pipeline.parsers.argstream import CallStream, StreamRule
from node.pipeline.parsers.blocks import BlockParse
from node.pipeline.parsers.calls import CallEmitter, ToolOptions
from node.pipeline.parsers.events import ContentDelta, Event

_SEPARATORS = " \t\r\n;"  # what may follow the last streamed call as markup

_UNDECIDED, _CALLS, _CONTENT = 0, 1, 2


class WholeOutputToolParser:
    __slots__ = ("_buf", "_called", "_calls", "_dropped", "_max", "_openers", "_parse", "_rules", "_state", "_stream")

    def __init__(
        self,
        openers: Sequence[str],
        parse: BlockParse,
        options: ToolOptions,
        stream: tuple[StreamRule, StreamRule] | None = None,
    ) -> None:
        self._openers = tuple(openers)
        self._parse = parse
        self._calls = CallEmitter(options)
        self._max = options.max_call_chars
        self._state = _UNDECIDED
        self._buf = ""  # the output since the last streamed call ended, less the released part of an open call
        self._dropped = 0  # released characters of the open call no longer in _buf (the bound counts them)
        self._rules = stream  # (the first call, a later call)
        self._stream: CallStream | None = None
        self._called = False  # a call has streamed

    def feed(self, text: str, token_ids: Sequence[int] = ()) -> list[Event]:
        if self._state == _CONTENT:
            return [ContentDelta(text)] if text else []
        self._buf += text
        if self._state == _UNDECIDED:
            head = self._buf.lstrip()
            if not head or any(opener.startswith(head) for opener in self._openers):
                return []  # only whitespace or part of an opener so far
            self._state = _CALLS if head.startswith(self._openers) else _CONTENT
            if self._state == _CALLS and self._rules is not None:
                self._stream = CallStream(self._rules[0])
        out: list[Event] = []
        if self._stream is not None:
            self._pump(out)
        if self._state == _CONTENT or self._dropped + len(self._buf) > self._max:
            self._state = _CONTENT
            text, self._buf = self._buf, ""
            if text:
                out.append(ContentDelta(text))
        return out

    def _pump(self, out: list[Event]) -> None:
        """Advance the calls over the held text, never past the bound (so where a call ends, and whether one
        starts, depends on the text alone)."""
        assert self._rules is not None
        while (stream := self._stream) is not None:
            room = self._max - self._dropped
            upto = min(len(self._buf), room)
            stream.advance(self._buf, upto, self._calls, out)
            if stream.spilled:  # the call broke: the rest of the output is content
                self._buf, self._state, self._stream = self._buf[upto:], _CONTENT, None
                return
            at = stream.closed_at
            if at < 0:
                if stream.started and len(self._buf) > room:
                    stream.abort(self._buf, room, out)
                    self._buf, self._state, self._stream = "", _CONTENT, None
                    return
                dropped = stream.drop()
                self._buf, self._dropped = self._buf[dropped:], self._dropped + dropped
                return
            self._buf, self._called, self._dropped = self._buf[at:], True, 0
            self._stream = CallStream(self._rules[1])

    def finish(self) -> list[Event]:
        text, self._buf = self._buf, ""
        stream, self._stream = self._stream, None
        if self._state == _CALLS:
            out: list[Event] = []
            if stream is not None and stream.started:  # cut short: it ends with what was sent
                stream.end(text, "", out)
                return out
            if self._called and not text.strip(_SEPARATORS):
                return []
            calls = self._parse(text, self._calls)
            if calls is not None and self._calls.accepts(calls):
                return self._calls.emit(calls)
        return [ContentDelta(text)] if text else []
