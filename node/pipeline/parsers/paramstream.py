"""Streaming a Qwen3-Coder call's arguments one parameter at a time (as SMG does), as JSON text.

The block is ``<function=NAME>`` then ``<parameter=KEY>VALUE</parameter>`` runs then ``</function>`` (only
blanks between). The call starts at the function tag (name known and accepted; otherwise the block is held and
decided whole at its end marker, as `calls.py` says). A value becomes JSON only once its parameter closes (its
type comes from the tool list, and ``3`` may yet become ``35``), so each closed parameter is released as one
fragment: ``{"city": "Paris"`` for the first, ``, "days": 3`` for the next, and ``}`` at ``</function>``. The
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
from typing import Final

from node.pipeline.parsers.argstream import MAX_HEAD_CHARS
from node.pipeline.parsers.calls import CallEmitter, typed_value
from node.pipeline.parsers.events import ContentDelta, Event, ToolCallArgsDelta, ToolCallEnd

_HEAD: Final = re.compile(r"\s*<function=([^>]*)>")
_BLANK: Final = re.compile(r"\s*")
_OPEN: Final = "<parameter="
_CLOSE: Final = "</parameter>"
_FUNCTION_CLOSE: Final = "</function>"

_WAIT, _HOLD, _ARGS, _TRAILER, _SPILL = range(5)


class ParamStream:
    __slots__ = ("_calls", "_close_scan", "_first", "_index", "_key_end", "_name", "_pos", "_state")

    def __init__(self) -> None:
        self._state = _WAIT
        self._pos = 0  # consumed up to here (in _ARGS: where the next parameter or </function> starts)
        self._key_end = -1  # the open parameter's ">" (-1: not found yet)
        self._close_scan = 0  # the open parameter's text before this holds no </parameter>
        self._first = True
        self._index = -1
        self._name = ""
        self._calls: CallEmitter | None = None

    @property
    def started(self) -> bool:
        return self._state >= _ARGS

    def advance(self, block: str, upto: int, calls: CallEmitter, out: list[Event]) -> None:
        if self._state == _WAIT:
            match = _HEAD.match(block, 0, min(upto, MAX_HEAD_CHARS))
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
        while self._state == _ARGS:
            at = _BLANK.match(block, self._pos, upto).end()  # type: ignore[union-attr]
            if at == upto:
                return
            if block.startswith(_OPEN, at):
                if not self._parameter(block, at, upto, out):
                    return
            elif block.startswith(_FUNCTION_CLOSE, at):
                out.append(ToolCallArgsDelta(self._index, "{}" if self._first else "}"))
                self._state, self._pos = _TRAILER, at + len(_FUNCTION_CLOSE)
            elif not (_OPEN.startswith(block[at:upto]) or _FUNCTION_CLOSE.startswith(block[at:upto])):
                self._spill(at, out)
            else:  # a tag still arriving
                return
        if self._state == _SPILL and upto > self._pos:
            out.append(ContentDelta(block[self._pos : upto]))
            self._pos = upto

    def _parameter(self, block: str, at: int, upto: int, out: list[Event]) -> bool:
        """Release the parameter at ``at`` if it has closed within ``block[:upto]``; False while it is open."""
        self._pos = at
        if self._key_end < 0:
            self._key_end = block.find(">", max(at + len(_OPEN), self._close_scan), upto)
            if self._key_end < 0:
                self._close_scan = upto
                return False
            self._close_scan = self._key_end + 1
        close = block.find(_CLOSE, self._close_scan, upto)
        if close < 0:
            self._close_scan = max(self._close_scan, upto - len(_CLOSE) + 1)
            return False
        key = block[at + len(_OPEN) : self._key_end].strip()
        raw = block[self._key_end + 1 : close].removeprefix("\n").removesuffix("\n")
        assert self._calls is not None
        value = typed_value(raw, self._calls.schema_type(self._name, key), guess=False)
        try:
            fragment = json.dumps(key) + ": " + json.dumps(value, ensure_ascii=False, allow_nan=False)
        except (ValueError, RecursionError):  # a value JSON cannot write (NaN): the call breaks here
            self._spill(at, out)
            return True
        out.append(ToolCallArgsDelta(self._index, ("{" if self._first else ", ") + fragment))
        self._first = False
        self._pos = self._close_scan = close + len(_CLOSE)
        self._key_end = -1
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
        out.append(ToolCallEnd(self._index))
        rest = block[self._pos :]
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
        return dropped
