"""A reasoning parser followed by a tool-call parser, as one parser: tool calls are looked for only in
the content the reasoning parser lets through (a call written while thinking is reasoning)."""

from __future__ import annotations

from collections.abc import Sequence

from node.pipeline.parsers.events import ContentDelta, Event, StreamParser


class ChainedParser:
    __slots__ = ("_reasoning", "_tools")

    def __init__(self, reasoning: StreamParser, tools: StreamParser) -> None:
        self._reasoning = reasoning
        self._tools = tools

    def feed(self, text: str, token_ids: Sequence[int] = ()) -> list[Event]:
        return self._through(self._reasoning.feed(text, token_ids), final=False)

    def finish(self) -> list[Event]:
        return self._through(self._reasoning.finish(), final=True)

    def _through(self, events: list[Event], *, final: bool) -> list[Event]:
        out: list[Event] = []
        for event in events:
            if isinstance(event, ContentDelta):
                out += self._tools.feed(event.text)
            else:
                out.append(event)
        if final:
            out += self._tools.finish()
        return out


class PlainParser:
    """No markup: every piece of text is content."""

    __slots__ = ()

    def feed(self, text: str, token_ids: Sequence[int] = ()) -> list[Event]:
        return [ContentDelta(text)] if text else []

    def finish(self) -> list[Event]:
        return []
