"""Streaming an XML-parameter call's arguments one parameter at a time (as SMG does), as JSON text.

Qwen3-Coder: ``<function=NAME>`` then ``<parameter=KEY>VALUE</parameter>`` runs then ``</function>``; GLM-4.5:
``NAME`` then ``<arg_key>KEY</arg_key> <arg_value>VALUE</arg_value>`` pairs up to the end marker (only blanks
between). A `ParamDialect` says which. The call starts once the name is complete (Qwen: its function tag; GLM:
the first ``<arg_key>``; a GLM call without parameters is decided whole) and accepted; otherwise the block is
held and decided whole at its end marker, as `calls.py` says. A value becomes JSON only once its parameter closes (its
type comes from the tool list, and ``3`` may yet become ``35``), so each closed parameter is released as one
fragment: ``{"city": "Paris"`` for the first, ``, "days": 3`` for the next, and ``}`` at ``</function>``
(GLM: at the end marker; cut by the end of output, no ``}``). The
separators are ``json.dumps``'s, so a call's fragments concatenate to what the whole-block parser writes
(a key written twice stays twice: a JSON reader keeps the last, as the old dict did).

After the start, text that is neither blanks, a parameter nor ``</function>`` ends the call (arguments as
sent) and is content with the rest of the block; a parameter still open at the end marker or the end of
output is content after the call's end; the bound ends the call as in `argstream.CallStream`. Every decision
depends on the block's text so far (a tag is acted on once complete; a partial tag waits).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Final

from node.pipeline.parsers.argstream import MAX_HEAD_CHARS
from node.pipeline.parsers.calls import CallEmitter, typed_value
from node.pipeline.parsers.events import ContentDelta, Event, ToolCallArgsDelta, ToolCallEnd

_BLANK: Final = re.compile(r"\s*")


@dataclass(frozen=True, slots=True)
class ParamDialect:
    head: re.Pattern[str]  # from the block's start to where the parameters begin; group 1: the name
    key_open: str
    key_close: str
    value_open: str  # after the key and blanks ("": the value follows the key at once)
    value_close: str
    trim_newline: bool  # one leading and one trailing newline are layout, not value (Qwen3-Coder)
    guess: bool  # an undeclared type is JSON when it parses (GLM), else text (see calls.typed_value)
    close: str | None  # what ends the arguments (None: the end marker)


QWEN3_CODER: Final = ParamDialect(
    re.compile(r"\s*<function=([^>]*)>"), "<parameter=", ">", "", "</parameter>", True, False, "</function>"
)
GLM45: Final = ParamDialect(
    re.compile(r"\s*([^<]*)(?=<arg_key>)"), "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", False, True, None
)

_WAIT, _HOLD, _ARGS, _TRAILER, _SPILL = range(5)


class ParamStream:
    __slots__ = (
        "_calls",
        "_close_scan",
        "_dialect",
        "_first",
        "_index",
        "_key_end",
        "_name",
        "_pos",
        "_state",
        "_value_start",
    )

    def __init__(self, dialect: ParamDialect) -> None:
        self._dialect = dialect
        self._state = _WAIT
        self._pos = 0  # consumed up to here (in _ARGS: where the next parameter or </function> starts)
        self._key_end = -1  # where the open parameter's key ends (-1: not found yet)
        self._value_start = -1  # where its value starts (-1: not found yet)
        self._close_scan = 0  # the open parameter's text before this holds nothing still looked for
        self._first = True
        self._index = -1
        self._name = ""
        self._calls: CallEmitter | None = None

    @property
    def started(self) -> bool:
        return self._state >= _ARGS

    def advance(self, block: str, upto: int, calls: CallEmitter, out: list[Event]) -> None:
        if self._state == _WAIT:
            match = self._dialect.head.match(block, 0, min(upto, MAX_HEAD_CHARS))
            if match is None:
                if upto >= MAX_HEAD_CHARS:
                    self._state = _HOLD
                return
            name = match.group(1).strip()
            if not name or "\n" in name or "<" in name or not calls.accepts_name(name):
                self._state = _HOLD
                return
            start = calls.start(name)
            out.append(start)
            self._index, self._name, self._calls = start.index, name, calls
            self._state, self._pos = _ARGS, match.end()
        if self._state >= _ARGS:
            self._release(block, upto, out)

    def _release(self, block: str, upto: int, out: list[Event]) -> None:
        dialect = self._dialect
        while self._state == _ARGS:
            at = _BLANK.match(block, self._pos, upto).end()  # type: ignore[union-attr]
            if at == upto:
                return
            # Bounded by upto like every decision here: text past it must not change what is released.
            if block.startswith(dialect.key_open, at, upto):
                if not self._parameter(block, at, upto, out):
                    return
            elif dialect.close is not None and block.startswith(dialect.close, at, upto):
                out.append(ToolCallArgsDelta(self._index, "{}" if self._first else "}"))
                self._state, self._pos = _TRAILER, at + len(dialect.close)
            elif dialect.key_open.startswith(block[at:upto]) or (dialect.close or "").startswith(block[at:upto]):
                return  # a tag still arriving
            else:
                self._spill(at, out)
        if self._state == _SPILL and upto > self._pos:
            out.append(ContentDelta(block[self._pos : upto]))
            self._pos = upto

    def _parameter(self, block: str, at: int, upto: int, out: list[Event]) -> bool:
        """Release the parameter at ``at`` if it has closed within ``block[:upto]``; False while it is open.
        Each search resumes where the last one stopped, so a long value is scanned once."""
        dialect = self._dialect
        self._pos = at
        if self._key_end < 0:
            start = max(at + len(dialect.key_open), self._close_scan)
            self._key_end = block.find(dialect.key_close, start, upto)
            if self._key_end < 0:
                self._close_scan = max(start, upto - len(dialect.key_close) + 1)
                return False
            self._close_scan = self._key_end + len(dialect.key_close)
        if self._value_start < 0:
            if dialect.value_open:
                gap = self._close_scan = _BLANK.match(block, self._close_scan, upto).end()  # type: ignore[union-attr]
                if not block.startswith(dialect.value_open, gap):
                    if dialect.value_open.startswith(block[gap:upto]):
                        return False
                    self._spill(at, out)
                    return True
                self._value_start = self._close_scan = gap + len(dialect.value_open)
            else:
                self._value_start = self._close_scan
        close = block.find(dialect.value_close, self._close_scan, upto)
        if close < 0:
            self._close_scan = max(self._close_scan, upto - len(dialect.value_close) + 1)
            return False
        key = block[at + len(dialect.key_open) : self._key_end].strip()
        raw = block[self._value_start : close]
        if dialect.trim_newline:
            raw = raw.removeprefix("\n").removesuffix("\n")
        assert self._calls is not None
        value = typed_value(raw, self._calls.schema_type(self._name, key), guess=dialect.guess)
        try:
            fragment = json.dumps(key) + ": " + json.dumps(value, ensure_ascii=False, allow_nan=False)
        except (ValueError, RecursionError):  # a value JSON cannot write (NaN): the call breaks here
            self._spill(at, out)
            return True
        out.append(ToolCallArgsDelta(self._index, ("{" if self._first else ", ") + fragment))
        self._first = False
        self._pos = self._close_scan = close + len(dialect.value_close)
        self._key_end = self._value_start = -1
        return True

    def _spill(self, at: int, out: list[Event]) -> None:
        out.append(ToolCallEnd(self._index))
        self._state, self._pos = _SPILL, at

    def end(self, block: str, marker: str, out: list[Event]) -> bool:
        """As `CallStream.end`: the call ends; an open parameter or stray trailer is content."""
        self._release(block, len(block), out)
        if self._state == _SPILL:
            if marker:
                out.append(ContentDelta(marker))
            return False
        rest = block[self._pos :]
        if self._state == _ARGS and self._dialect.close is None and marker and not rest.strip():
            out.append(ToolCallArgsDelta(self._index, "{}" if self._first else "}"))  # the marker closes them
        out.append(ToolCallEnd(self._index))
        if not rest.strip():
            return True
        out.append(ContentDelta(rest + marker))
        return False

    def abort(self, block: str, stop: int, out: list[Event]) -> None:
        self._release(block, stop, out)
        if self._state != _SPILL:
            out.append(ToolCallEnd(self._index))
        if self._pos < len(block):
            out.append(ContentDelta(block[self._pos :]))
        self._state, self._pos = _SPILL, len(block)

    def drop(self) -> int:
        if self._state not in (_ARGS, _SPILL):
            return 0
        dropped = self._pos
        self._pos = 0
        self._close_scan = max(0, self._close_scan - dropped)
        if self._key_end >= 0:
            self._key_end -= dropped
        if self._value_start >= 0:
            self._value_start -= dropped
        return dropped
