"""The engine shared by tool-call formats that mark calls with begin/end strings.

A format is described by a `BlockFormat`: the call markers, optional section markers that wrap a run of
calls (DeepSeek, Kimi K2), and a function that parses one call's inner text. Content streams through with
only a possible marker prefix held back; a call's text is held until it closes and then becomes call events
or, per the degrade rule in `calls`, content (verbatim, markers included).

Whitespace that only separates markup (between calls in a section, right after a call) is dropped, as the
published parsers do, so a reply that is only calls has no content.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from node.pipeline.parsers.calls import CallEmitter, ParsedCall, ToolOptions
from node.pipeline.parsers.events import ContentDelta, Event
from node.pipeline.parsers.markers import MarkerSet

BlockParse = Callable[[str, CallEmitter], Sequence[ParsedCall] | None]


@dataclass(frozen=True, slots=True)
class BlockFormat:
    call_begin: str
    call_end: str | None  # None: a call runs to the next call_begin or to the end of output (Mistral)
    parse: BlockParse  # the text between the call markers -> its calls, or None if malformed
    section_begin: str | None = None
    section_end: str | None = None


_CONTENT, _SECTION, _CALL, _PASSTHROUGH = 0, 1, 2, 3


class BlockToolParser:
    """Streams content and emits each call once it closes."""

    __slots__ = (
        "_buf",
        "_call_markers",
        "_call_raw",
        "_calls",
        "_content_markers",
        "_fmt",
        "_max",
        "_open_raw",
        "_scanned",
        "_section_calls",
        "_section_markers",
        "_state",
        "_strip",
    )

    def __init__(self, fmt: BlockFormat, options: ToolOptions) -> None:
        self._fmt = fmt
        self._calls = CallEmitter(options)
        self._max = options.max_call_chars
        self._content_markers = MarkerSet([fmt.section_begin or fmt.call_begin])
        self._section_markers = MarkerSet([fmt.call_begin, fmt.section_end or ""])
        self._call_markers = MarkerSet([fmt.call_end or fmt.call_begin])
        self._state = _CONTENT
        self._buf = ""
        self._open_raw = ""  # a section marker (and blanks after it) held back while its section has no call yet
        self._call_raw = ""  # the begin marker of the open call
        self._strip = False  # drop leading whitespace of the next content (it follows a call)
        self._section_calls = False  # the open section has produced a call
        # In a section or call, the buffer prefix already searched for a marker: a long call is scanned once,
        # not once per feed.
        self._scanned = 0

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
            self._state, self._call_raw = _CALL, marker
        return True

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
            self._state, self._call_raw = _CALL, marker
        else:  # the section closed; if no call came of it, its markers are content, verbatim
            if not self._section_calls:
                self._emit(out, self._open_raw + marker)
            self._open_raw = ""
            self._state, self._strip = _CONTENT, self._section_calls
        return True

    def _call(self, out: list[Event], *, final: bool) -> bool:
        end = self._fmt.call_end
        found = self._call_markers.find(self._buf, self._scanned)
        if found is None:
            self._scanned = self._call_markers.resume_at(self._buf)
            if final:
                if end is None:  # the end of output closes a call that has no end marker
                    self._close(out, self._buf, self._call_raw + self._buf)
                else:
                    self._emit(out, self._open_raw + self._call_raw + self._buf)
                self._buf = self._open_raw = self._call_raw = ""
                self._state, self._scanned = _CONTENT, 0
            elif len(self._open_raw) + len(self._call_raw) + len(self._buf) > self._max:
                self._overflow(out, self._open_raw + self._call_raw)
            return False
        at, marker = found
        self._scanned = 0
        block = self._buf[:at]
        self._buf = self._buf[at + len(marker) :]
        if len(self._open_raw) + len(self._call_raw) + at + len(marker) > self._max:
            self._overflow(out, self._open_raw + self._call_raw + block + marker)
            return True
        if end is None:  # the marker found begins the next call
            self._close(out, block, self._call_raw + block)
            self._state, self._call_raw = _CALL, marker
            return True
        accepted = self._close(out, block, self._call_raw + block + marker)
        if self._fmt.section_begin is not None:
            self._state = _SECTION
        else:
            self._state, self._strip = _CONTENT, accepted
        return True

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

        Past max_call_chars this is not a call we will hold: the rest of the output is content."""
        self._emit(out, raw + self._buf)
        self._buf = self._open_raw = self._call_raw = ""
        self._state = _PASSTHROUGH
