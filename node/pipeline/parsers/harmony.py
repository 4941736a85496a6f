"""gpt-oss Harmony output: messages with channels, reasoning and tool calls in one format.

The prompt ends with ``<|start|>assistant``, so output looks like::

    <|channel|>analysis<|message|>REASONING<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"P"}<|call|>
    <|start|>assistant<|channel|>final<|message|>CONTENT<|return|>

Mapping: ``analysis`` → reasoning; ``final`` and recipient-less ``commentary`` (preambles) → content; a
message addressed ``to=functions.NAME`` → a tool call whose body is the JSON arguments (content, verbatim,
when built without tool parsing: the request had no tools); a message to a
built-in tool (``browser.*``, ``python``) → reasoning. ``<|call|>`` and ``<|return|>`` are stop tokens the
pipeline may strip, so a call body still open at the end of output is a call if it parses (else content).
Text outside any message (a model not speaking Harmony) is content.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

from node.pipeline.parsers.argstream import CallStream, StreamRule
from node.pipeline.parsers.calls import CallEmitter, ParsedCall, ToolOptions, arguments_text
from node.pipeline.parsers.events import ContentDelta, Event, ReasoningDelta
from node.pipeline.parsers.markers import MarkerSet

START: Final = "<|start|>"
CHANNEL: Final = "<|channel|>"
MESSAGE: Final = "<|message|>"
BODY_ENDS: Final = ("<|end|>", "<|call|>", "<|return|>")
# A message header (role, channel, recipient, content type) is a few dozen characters; one this long is
# not a header, and holding it any longer would stall a reply that merely mentions a marker.
MAX_HEADER_CHARS: Final = 512
FUNCTIONS_PREFIX: Final = "functions."

# A call body is the arguments object itself; it streams from its "{" (see argstream.py).
_BODY_STREAM: Final = StreamRule(head=re.compile(r"\s*\{"), trailer=re.compile(r"\s*"))
_CHANNEL_NAME: Final = re.compile(re.escape(CHANNEL) + r"\s*([A-Za-z_]+)")
_RECIPIENT: Final = re.compile(r"\bto=([^\s<]+)")

_OUTSIDE, _HEADER, _BODY = 0, 1, 2
# _SPILL: the rest of a call body too long to hold, emitted as content up to and including its end marker.
_REASONING, _CONTENT, _TOOL, _SPILL = 0, 1, 2, 3


class HarmonyParser:
    __slots__ = (
        "_body_kind",
        "_buf",
        "_calls",
        "_header",
        "_max",
        "_parse_tools",
        "_scanned",
        "_state",
        "_stream",
        "_tool_name",
    )

    _open = MarkerSet([START, CHANNEL])
    _message = MarkerSet([MESSAGE])
    _ends = MarkerSet(BODY_ENDS)

    def __init__(self, options: ToolOptions, *, parse_tools: bool = True) -> None:
        self._calls = CallEmitter(options)
        self._max = options.max_call_chars
        self._parse_tools = parse_tools
        self._state = _OUTSIDE
        self._buf = ""
        self._header = ""  # raw header text of the current message, markers included
        self._body_kind = _CONTENT
        self._tool_name = ""
        self._scanned = 0  # the prefix of a held call body already searched for its end marker
        self._stream: CallStream | None = None  # the open call body's argument stream

    def feed(self, text: str, token_ids: Sequence[int] = ()) -> list[Event]:
        if self._state == _OUTSIDE and not self._buf and not self._open.may_hold(text):
            return [ContentDelta(text)] if text else []
        if self._state == _BODY and self._body_kind != _TOOL and not self._buf and not self._ends.may_hold(text):
            if not text:
                return []
            return [ReasoningDelta(text) if self._body_kind == _REASONING else ContentDelta(text)]
        self._buf += text
        out: list[Event] = []
        while self._step(out, final=False):
            pass
        return out

    def finish(self) -> list[Event]:
        out: list[Event] = []
        while self._step(out, final=True):
            pass
        return out

    def _step(self, out: list[Event], *, final: bool) -> bool:
        """Advance over the buffer once; True while there may be more to do."""
        if self._state == _OUTSIDE:
            found = self._open.find(self._buf)
            if found is None:
                keep = 0 if final else self._open.held_len(self._buf)
                _add(out, ContentDelta(self._buf[: len(self._buf) - keep]))
                self._buf = self._buf[len(self._buf) - keep :]
                return False
            at, marker = found
            _add(out, ContentDelta(self._buf[:at]))
            self._header, self._buf = marker, self._buf[at + len(marker) :]
            self._state = _HEADER
            return True
        if self._state == _HEADER:
            found = self._message.find(self._buf)
            # The bound counts the marker itself, so a header is refused the same way however it is split.
            if found is None or len(self._header) + found[0] + len(MESSAGE) > MAX_HEADER_CHARS:
                if final or len(self._header) + len(self._buf) > MAX_HEADER_CHARS:
                    # Not a header after all: its text is content, and the search resumes after its marker.
                    _add(out, ContentDelta(self._header))
                    self._header, self._state = "", _OUTSIDE
                    return True
                return False
            at = found[0]
            self._header += self._buf[:at] + MESSAGE
            self._buf = self._buf[at + len(MESSAGE) :]
            self._open_body()
            return True
        found = self._ends.find(self._buf, self._scanned)
        if self._body_kind == _TOOL:
            return self._tool_body(out, found, final=final)
        kind = ReasoningDelta if self._body_kind == _REASONING else ContentDelta
        if found is None:
            keep = 0 if final else self._ends.held_len(self._buf)
            _add(out, kind(self._buf[: len(self._buf) - keep]))
            self._buf = self._buf[len(self._buf) - keep :]
            return False
        at, marker = found
        _add(out, kind(self._buf[: at + len(marker)] if self._body_kind == _SPILL else self._buf[:at]))
        self._buf = self._buf[at + len(marker) :]
        self._state = _OUTSIDE
        return True

    def _open_body(self) -> None:
        channel = _CHANNEL_NAME.search(self._header)
        recipient = _RECIPIENT.search(self._header)
        name = channel.group(1) if channel else ""
        self._state = _BODY
        if recipient is not None and recipient.group(1).startswith(FUNCTIONS_PREFIX):
            self._body_kind, self._tool_name = _TOOL, recipient.group(1).removeprefix(FUNCTIONS_PREFIX)
            self._stream = CallStream(_BODY_STREAM, self._tool_name) if self._parse_tools else None
        elif recipient is not None or name == "analysis":
            self._body_kind = _REASONING
        else:
            self._body_kind = _CONTENT

    def _tool_body(self, out: list[Event], found: tuple[int, str] | None, *, final: bool) -> bool:
        stream = self._stream
        started = stream is not None and stream.started
        limit = self._max - len(self._header)
        if found is None and not final:
            self._scanned = self._ends.resume_at(self._buf)
            if len(self._buf) > limit:  # not a call we will hold
                # An end-marker prefix stays held: spilled, it could no longer end the message, which would
                # then run on as content where a feed holding the whole marker ends it.
                keep = len(self._buf) - self._ends.held_len(self._buf)
                self._spill(out, stream, self._buf[:keep])
                self._buf = self._buf[keep:]
                return True
            if stream is not None:
                stream.advance(self._buf, len(self._buf) - self._ends.held_len(self._buf), self._calls, out)
            return False
        at, marker = found if found is not None else (len(self._buf), "")
        self._scanned = 0
        if at + len(marker) > limit:
            self._spill(out, stream, self._buf[: at + len(marker)])
            self._buf = self._buf[at + len(marker) :]
            self._body_kind, self._state = _CONTENT, _OUTSIDE
            return True
        if stream is not None:
            stream.advance(self._buf, at, self._calls, out)
            started = stream.started
        body = self._buf[:at]
        self._buf = self._buf[at + len(marker) :]
        header, self._header, self._state, self._stream = self._header, "", _OUTSIDE, None
        if started and stream is not None:
            stream.end(body, marker, out)
            return True
        arguments = arguments_text(body)
        calls = [ParsedCall(self._tool_name, arguments)] if arguments is not None else []
        if calls and self._parse_tools and self._calls.accepts(calls):
            out += self._calls.emit(calls)
        else:
            _add(out, ContentDelta(header + body + marker))
        return True

    def _spill(self, out: list[Event], stream: CallStream | None, body: str) -> None:
        """The body outgrew max_call_chars: a started call ends at the bound (short of an end-marker prefix
        there), the rest of ``body`` is content, and so is the rest of the message through its end marker."""
        if stream is not None:
            head = body[: max(0, self._max - len(self._header))]
            stop = len(head) - self._ends.held_len(head)
            stream.advance(body, stop, self._calls, out)  # what a feed ending at the bound would have sent
        if stream is not None and stream.started:
            stream.abort(body, stop, out)
        else:
            _add(out, ContentDelta(self._header + body))
        self._header, self._body_kind, self._scanned, self._stream = "", _SPILL, 0, None


def _add(out: list[Event], event: ContentDelta | ReasoningDelta) -> None:
    if event.text:
        out.append(event)
