"""Streaming one tool call's JSON arguments as the model writes them (Hermes/Qwen, Llama 3 JSON, Mistral
``[ARGS]``, DeepSeek V3/V3.1, Kimi K2, gpt-oss Harmony), as OpenAI, SMG and vLLM stream them.

A `CallStream` reads the text of one call block (what follows its begin marker) as it arrives, given only
text that cannot be part of the end marker. Its life:

- HEAD: the text before the arguments is held (the old degrade rule applies) until the format's `head`
  pattern matches the block's start *through the arguments' opening brace*: the name is then known. A name the
  request did not list, or no match within `MAX_HEAD_CHARS`, is HOLD: the block is held to its end marker and
  decided whole, as before (`calls.py`: a call or content verbatim). Otherwise ``ToolCallStart`` goes out
  (name first, no arguments yet). Starting at the brace rather than at the name keeps "arguments that are not
  an object" (``"arguments": "..."``, a list) on the old, whole-block path, and costs a few characters. A
  wrapper that writes ``"arguments"`` before ``"name"`` does not match either: its arguments are complete
  before the name is known, so holding it to the end marker delays nothing that could have streamed.
- ARGS: characters are fed to a `JsonPrefix` and every accepted one is released as ``ToolCallArgsDelta``: the
  fragments are the model's own text, so their concatenation is the arguments object exactly as written
  (whitespace included; no re-serialisation could be streamed without holding values back), and the
  non-streaming ``arguments`` is that same concatenation (the API layers merge the same events). Calls
  decided whole keep ``json.dumps``'s form; either way a call's fragments concatenate to its arguments.
- TRAILER: once the object closes, what follows (the wrapper's ``}``, DeepSeek V3's closing fence, blanks) is
  held and checked against the format's `trailer` pattern when the call ends (or, with a `closer`, ends the
  call at the wrapper's ``}``: Llama 3 JSON has no end marker).
- SPILL: a character that breaks the JSON ends the call (``ToolCallEnd``, the arguments as sent so far) and it
  and the rest of the block, end marker included, are content: a started call cannot be taken back, and no
  text is lost.

Ends: at the end marker the call ends (the arguments may be unfinished: the model closed the call); a trailer
that does not fit is content after ``ToolCallEnd``. At the end of output (max_tokens) a started call ends with
the arguments sent so far, as OpenAI ends a call cut by ``length`` (the API keeps ``finish_reason: "length"``;
"tool_calls" is only for a choice that stopped on its own). Past ``max_call_chars`` a started call ends where
the bound falls and the rest of the output is content, as a block that is not held always was.

Qwen3-Coder and GLM-4.5 stream per parameter (paramstream.py: a value becomes JSON only once its parameter
closes). Not streamed: pythonic lists still release a call when it closes (its values are Python literals,
known only once the list parses), as do ``tool_choice: "required"``'s array (forced.py) and Mistral's
JSON-list form.

Chunk-boundary rule: every decision is a function of the block's text so far. `head` patterns are anchored
and unambiguous up to the brace (the match found in a prefix is the match in any extension), `JsonPrefix`
decides per character, the parser never advances into a possible end-marker prefix, and at the bound it
advances exactly to the bound (short of a marker prefix there) before ending the call.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, Protocol

from node.pipeline.parsers.calls import CallEmitter
from node.pipeline.parsers.events import ContentDelta, Event, ToolCallArgsDelta, ToolCallEnd
from node.pipeline.parsers.jsonprefix import JsonPrefix

# A head (name, id, wrapper keys) is a few dozen characters; a block whose arguments have not begun by then is
# decided whole at its end marker, and the head pattern is not re-run over a long held block on every feed.
MAX_HEAD_CHARS: Final = 512

_HEAD, _HOLD, _ARGS, _TRAILER, _SPILL, _CLOSED = range(6)


@dataclass(frozen=True, slots=True)
class StreamRule:
    """How a format's call block streams: ``head`` matches from the block's start through the arguments'
    ``{`` (group ``name`` unless the name is known beforehand, optional group ``id``); ``trailer`` fullmatches
    what may follow the arguments object up to the end marker. Formats without an end marker (Llama 3 JSON)
    give ``closer`` instead: the call ends at the first non-blank character after the arguments, which must be
    ``closer`` (the wrapper's ``}``; anything else breaks the call)."""

    head: re.Pattern[str]
    trailer: re.Pattern[str]
    closer: str | None = None


_BLANK: Final = re.compile(r"\s*")


class ArgStream(Protocol):
    """One call block's streaming reader, as the block engine drives it (`CallStream`; Qwen3-Coder's
    `paramstream.ParamStream`)."""

    @property
    def started(self) -> bool: ...

    def advance(self, block: str, upto: int, calls: CallEmitter, out: list[Event]) -> None: ...

    def end(self, block: str, marker: str, out: list[Event]) -> bool: ...

    def abort(self, block: str, stop: int, out: list[Event]) -> None: ...

    def drop(self) -> int: ...


class CallStream:
    __slots__ = ("_index", "_json", "_name", "_pos", "_rule", "_state")

    def __init__(self, rule: StreamRule, name: str | None = None) -> None:
        self._rule = rule
        self._name = name  # known from outside the block (Harmony's recipient)
        self._state = _HEAD
        self._json = JsonPrefix()
        self._pos = 0  # the block's characters before this were consumed (in TRAILER: where the trailer starts)
        self._index = -1

    @property
    def started(self) -> bool:
        return self._state >= _ARGS

    @property
    def spilled(self) -> bool:
        """The call broke: what follows is content."""
        return self._state == _SPILL

    def drop(self) -> int:
        """How many leading characters of the block the caller may drop now (released text no decision reads
        again: in ARGS and SPILL, everything before the read position); positions shift by as many. Keeps a
        long call's held buffer short, so appending to it stays cheap."""
        if self._state not in (_ARGS, _SPILL):
            return 0
        dropped, self._pos = self._pos, 0
        return dropped

    @property
    def closed_at(self) -> int:
        """Where a call ended by its ``closer`` ends in its block (-1 while open)."""
        return self._pos if self._state == _CLOSED else -1

    def advance(self, block: str, upto: int, calls: CallEmitter, out: list[Event]) -> None:
        """Read ``block[:upto]`` (``upto`` never reaches into a possible end marker)."""
        if self._state == _HEAD:
            match = self._rule.head.match(block, 0, min(upto, MAX_HEAD_CHARS))
            if match is None:
                if upto >= MAX_HEAD_CHARS:
                    self._state = _HOLD
                return
            name = self._name if self._name is not None else match["name"]
            if not name or not calls.accepts_name(name):
                self._state = _HOLD
                return
            start = calls.start(name, match.groupdict().get("id"))
            out.append(start)
            self._index = start.index
            self._state, self._pos = _ARGS, match.end() - 1
        if self._state >= _ARGS:
            self._release(block, upto, out)

    def _release(self, block: str, upto: int, out: list[Event]) -> None:
        if self._state == _ARGS and upto > self._pos:
            pos = self._pos
            stop = self._json.feed(block, pos, upto)
            if stop > pos:
                out.append(ToolCallArgsDelta(self._index, block[pos:stop]))
            self._pos = stop
            if self._json.done:
                self._state = _TRAILER
            elif self._json.broken:
                out.append(ToolCallEnd(self._index))
                self._state = _SPILL
        closer = self._rule.closer
        if self._state == _TRAILER and closer is not None:
            # Blanks before the closer are markup, consumed as read (a long run is not rescanned per feed).
            at = self._pos = _BLANK.match(block, self._pos, upto).end()  # type: ignore[union-attr]
            if at < upto:
                out.append(ToolCallEnd(self._index))
                if block[at] == closer:
                    self._state, self._pos = _CLOSED, at + 1
                    return
                self._state = _SPILL
        if self._state == _SPILL and upto > self._pos:
            out.append(ContentDelta(block[self._pos : upto]))
            self._pos = upto

    def end(self, block: str, marker: str, out: list[Event]) -> bool:
        """The block is complete (``marker``: its end marker, "" when the output or the block ended without
        one). Emits the call's end and any content; True if ``marker`` was the call's markup (consumed)."""
        self._release(block, len(block), out)
        if self._state == _SPILL:
            if marker:
                out.append(ContentDelta(marker))
            return False
        out.append(ToolCallEnd(self._index))
        if self._state == _ARGS:
            return True
        trailer = block[self._pos :]
        if self._rule.trailer.fullmatch(trailer) or (not marker and _BLANK.fullmatch(trailer)):
            return True
        out.append(ContentDelta(trailer + marker))
        return False

    def abort(self, block: str, stop: int, out: list[Event]) -> None:
        """The block outgrew the bound at ``stop``: the call ends there and the rest of ``block`` is content."""
        self._release(block, stop, out)
        if self._state != _SPILL:
            out.append(ToolCallEnd(self._index))
        rest = block[self._pos :]
        if rest:
            out.append(ContentDelta(rest))
        self._state = _SPILL
        self._pos = len(block)
