"""Typed events a streaming output parser produces, and the parser protocol.

A parser turns the detokenized text of one choice into events: plain content, reasoning, and tool calls.
Tool calls are framed: `ToolCallStart`, then `ToolCallArgsDelta` fragments whose concatenation is the call's
arguments as a JSON object text, then `ToolCallEnd`. Indexes count the calls of one choice from 0.

Invariant every parser keeps (the chunk-boundary rule): for any split of the same output into `feed` calls,
the events followed by `finish()`, once `coalesce`d, are the same.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class ContentDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True, slots=True)
class ToolCallArgsDelta:
    index: int
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallEnd:
    index: int


Event = ContentDelta | ReasoningDelta | ToolCallStart | ToolCallArgsDelta | ToolCallEnd


class StreamParser(Protocol):
    """A pure incremental parser for one choice's output text (no I/O, no clock)."""

    def feed(self, text: str, token_ids: Sequence[int] = ()) -> list[Event]:
        """Consume the next piece of output text; return the events it completes. ``token_ids`` are the ids
        that produced ``text``; the text-based parsers here ignore them (special tokens are matched by their
        text, so the detokenizer must keep special tokens in the text)."""
        ...

    def finish(self) -> list[Event]:
        """End of output: flush everything held back. An unfinished or malformed call that has not started
        becomes content; a started one ends with the arguments sent so far."""
        ...


def coalesce(events: Iterable[Event]) -> list[Event]:
    """Merge adjacent text deltas of the same kind (and the same call) and drop empty ones; the canonical
    form two event streams are compared in."""
    out: list[Event] = []
    for event in events:
        if isinstance(event, ContentDelta | ReasoningDelta | ToolCallArgsDelta) and not event.text:
            continue
        last = out[-1] if out else None
        if isinstance(event, ContentDelta) and isinstance(last, ContentDelta):
            out[-1] = ContentDelta(last.text + event.text)
        elif isinstance(event, ReasoningDelta) and isinstance(last, ReasoningDelta):
            out[-1] = ReasoningDelta(last.text + event.text)
        elif isinstance(event, ToolCallArgsDelta) and isinstance(last, ToolCallArgsDelta) and last.index == event.index:
            out[-1] = ToolCallArgsDelta(event.index, last.text + event.text)
        else:
            out.append(event)
    return out


def text_of(events: Iterable[Event], kind: type[ContentDelta] | type[ReasoningDelta] = ContentDelta) -> str:
    """The concatenated text of the content (or reasoning) deltas in ``events``."""
    return "".join(e.text for e in events if isinstance(e, kind))
