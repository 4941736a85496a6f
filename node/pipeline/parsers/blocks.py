"""The engine shared by tool-call formats that mark calls with begin/end strings.

A format is described by a `BlockFormat`: the call markers, optional section markers that wrap a run of
calls (DeepSeek, Kimi K2), a function that parses one call's inner text, and (JSON families) how a call's
arguments stream. Content streams through with only a possible marker prefix held back. A call whose
arguments stream (`argstream.CallStream`) is read as it arrives, never into a possible end-marker prefix;
any other call's text is held until it closes and then becomes call events or, per the degrade rule in
`calls`, content (verbatim, markers included).

Whitespace that only separates markup (between calls in a section, right after a call) is dropped, as the
published parsers do, so a reply that is only calls has no content.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from node.pipeline.parsers.argstream import ArgStream, CallStream, StreamRule
from node.pipeline.parsers.calls import CallEmitter, ParsedCall, ToolOptions
from node.pipeline.parsers.events import ContentDelta, Event
from node.pipeline.parsers.markers import marker_set

BlockParse = Callable[[str, CallEmitter], Sequence[ParsedCall] | None]


@dataclass(frozen=True, slots=True)
class BlockFormat:
    call_begin: str
    call_end: str | None  # None: a call runs to the next call_begin or to the end of output (Mistral)
    parse: BlockParse  # the text between the call markers -> its calls, or None if malformed
    section_begin: str | None = None
    section_end: str | None = None
    # How a call's arguments stream: a JSON family's rule, or a factory of another reader (Qwen3-Coder's
    # per-parameter one). None: a call is decided at its end.
    stream: StreamRule | Callable[[], ArgStream] | None = None


_CONTENT, _SECTION, _CALL, _PASSTHROUGH = 0, 1, 2, 3


class BlockToolParser:
    """Streams content, and calls: their arguments as written (streamed formats) or whole once they close."""

    __slots__ = (
        "_buf",
        "_call_markers",
        "_call_raw",
        "_calls",
        "_content_markers",
        "_fmt",
        "_limit",
        "_max",
        "_open_raw",
        "_scanned",
        "_section_calls",
        "_section_markers",
        "_state",
        "_stream",
        "_strip",
    )

    def __init__(self, fmt: BlockFormat, options: ToolOptions) -> None:
        self._fmt = fmt
        self._calls = CallEmitter(options)
        self._max = options.max_call_chars
        self._content_markers = marker_set(fmt.section_begin or fmt.call_begin)
        self._section_markers = marker_set(fmt.call_begin, fmt.section_end or "")
        self._call_markers = marker_set(fmt.call_end or fmt.call_begin)
        self._state = _CONTENT
        self._buf = ""
        self._open_raw = ""  # a section marker (and blanks after it) held back while its section has no call yet
        self._call_raw = ""  # the begin marker of the open call
        self._strip = False  # drop leading whitespace of the next content (it follows a call)
        self._section_calls = False  # the open section has produced a call
        # In a section or call, the buffer prefix already searched for a marker: a long call is scanned once,
        # not once per feed.
        self._scanned = 0
        self._stream: ArgStream | None = None  # the open call's argument stream
        self._limit = 0  # how long the open call's block may grow before it is not held (max_call_chars)

    def feed(self, text: str, token_ids: Sequence[int] = ()) -> list[Event]:
        if self._state == _PASSTHROUGH or (
            self._state == _CONTENT and not self._buf and not self._strip and not self._content_markers.may_hold(text)
        ):
            return [ContentDelta(text)] if text else []
        self._buf += text
        out: list[Event] = []
        self._run(out, final=False)
        return out

    def finish(self) -> list[Event]:
        out: list[Event] = []
        self._run(out, final=True)
        return out

    def _run(self, out: list[Event], *, final: bool) -> None:
        while True:
            if self._state == _CONTENT:
                if not self._content(out, final=final):
                    return
            elif self._state == _SECTION:
                if not self._section(out, final=final):
                    return
            elif self._state == _CALL:
                if not self._call(out, final=final):
                    return
            else:
                self._emit(out, self._buf)
                self._buf = ""
                return

    def _emit(self, out: list[Event], text: str) -> None:
        if text:
            out.append(ContentDelta(text))

    def _content(self, out: list[Event], *, final: bool) -> bool:
        if self._strip:
            self._buf = self._buf.lstrip()
            if not self._buf:
                return False
            self._strip = False
        found = self._content_markers.find(self._buf)
        if found is None:
            keep = 0 if final else self._content_markers.held_len(self._buf)
            self._emit(out, self._buf[: len(self._buf) - keep])
            self._buf = self._buf[len(self._buf) - keep :]
            return False
        at, marker = found
        self._emit(out, self._buf[:at])
        self._buf = self._buf[at + len(marker) :]
        if self._fmt.section_begin is not None:
            self._state, self._open_raw, self._section_calls = _SECTION, marker, False
        else:
            self._open_call(marker)
        return True

    def _open_call(self, marker: str) -> None:
        self._state, self._call_raw = _CALL, marker
        self._limit = self._max - len(self._open_raw) - len(marker)
        rule = self._fmt.stream
        self._stream = CallStream(rule) if isinstance(rule, StreamRule) else rule() if rule is not None else None

    def _section(self, out: list[Event], *, final: bool) -> bool:
        found = self._section_markers.find(self._buf, self._scanned)
        if found is None:
            self._scanned = self._section_markers.resume_at(self._buf)
            if final:
                self._emit(out, self._open_raw + self._buf)
                self._buf = self._open_raw = ""
                self._scanned = 0
            elif len(self._open_raw) + len(self._buf) > self._max:
                self._overflow(out, self._open_raw)
            return False
        at, marker = found
        self._scanned = 0
        gap = self._buf[:at]
        self._buf = self._buf[at + len(marker) :]
        if len(self._open_raw) + at + len(marker) > self._max:
            self._overflow(out, self._open_raw + gap + marker)
            return True
        if gap.strip():  # stray text between calls: content, verbatim
            self._emit(out, self._open_raw + gap)
            self._open_raw = ""
        elif not self._section_calls:  # markup whitespace, dropped only once the section is known to hold calls
            self._open_raw += gap
        if marker == self._fmt.call_begin:
            self._open_call(marker)
        else:  # the section closed; if no call came of it, its markers are content, verbatim
            if not self._section_calls:
                self._emit(out, self._open_raw + marker)
            self._open_raw = ""
            self._state, self._strip = _CONTENT, self._section_calls
        return True

    def _call(self, out: list[Event], *, final: bool) -> bool:
        end = self._fmt.call_end
        stream = self._stream
        found = self._call_markers.find(self._buf, self._scanned)
        if found is None:
            self._scanned = self._call_markers.resume_at(self._buf)
            if final:
                if stream is not None and stream.started:
                    self._strip = stream.end(self._buf, "", out)
                elif end is None:  # the end of output closes a call that has no end marker
                    self._close(out, self._buf, self._call_raw + self._buf)
                else:
                    self._emit(out, self._open_raw + self._call_raw + self._buf)
                self._buf = self._open_raw = self._call_raw = ""
                self._state, self._scanned, self._stream = _CONTENT, 0, None
            elif len(self._buf) > self._limit:
                self._overflow(out, self._open_raw + self._call_raw)
            elif stream is not None:
                self._advance(stream, out, len(self._buf) - self._call_markers.held_len(self._buf))
            return False
        at, marker = found
        self._scanned = 0
        if at + len(marker) > self._limit:
            self._overflow(out, self._open_raw + self._call_raw)
            return True
        if stream is not None:
            at -= self._advance(stream, out, at)
        block = self._buf[:at]
        self._buf = self._buf[at + len(marker) :]
        self._stream = None
        if end is None:  # the marker found begins the next call
            if stream is not None and stream.started:
                stream.end(block, "", out)
            else:
                self._close(out, block, self._call_raw + block)
            self._open_call(marker)
            return True
        if stream is not None and stream.started:
            accepted = stream.end(block, marker, out)
        else:
            accepted = self._close(out, block, self._call_raw + block + marker)
        if self._fmt.section_begin is not None:
            self._state = _SECTION
        else:
            self._state, self._strip = _CONTENT, accepted
        return True

    def _advance(self, stream: ArgStream, out: list[Event], upto: int) -> int:
        """Advance the call's stream to ``upto``; return how many leading characters left the buffer."""
        started = stream.started
        stream.advance(self._buf, upto, self._calls, out)
        if stream.started and not started:  # the section's markup is the call's now
            self._open_raw = ""
            self._section_calls = True
        dropped = stream.drop()
        if dropped:  # released text leaves the buffer; the bound still counts it
            self._buf = self._buf[dropped:]
            self._limit -= dropped
            self._scanned = max(0, self._scanned - dropped)
        return dropped

    def _close(self, out: list[Event], block: str, raw: str) -> bool:
        """Emit a closed call's events, or its raw text as content; True if it was a call."""
        calls = self._fmt.parse(block, self._calls)
        accepted = calls is not None and self._calls.accepts(calls)
        if calls is not None and accepted:
            out += self._calls.emit(calls)
            self._section_calls = True
        else:
            self._emit(out, self._open_raw + raw)
        self._open_raw = ""
        return accepted

    def _overflow(self, out: list[Event], raw: str) -> None:
        """``raw`` (markup and text taken from the buffer so far) and the buffer become content.

        Past max_call_chars this is not a call we will hold: the rest of the output is content. A call that
        has started ends where the bound falls (short of a marker prefix there, as a feed that stopped at the
        bound would), whatever the chunking."""
        stream = self._stream
        if stream is not None:
            head = self._buf[: max(0, self._limit)]
            stop = len(head) - self._call_markers.held_len(head)
            stop -= self._advance(stream, out, stop)  # what a feed ending at the bound would have started and sent
            if stream.started:
                stream.abort(self._buf, stop, out)
        if stream is None or not stream.started:
            self._emit(out, raw + self._buf)
        self._buf = self._open_raw = self._call_raw = ""
        self._state, self._stream = _PASSTHROUGH, None
