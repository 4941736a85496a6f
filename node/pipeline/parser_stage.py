"""The output parsers (node/pipeline/parsers/) as a text stage of the Output stage: one choice's parser turns
its text into the pipeline's typed events (reasoning, tool calls), content passing on.

Which parser a request gets (the model's, the request's tools) is the caller's choice: a ``Stages`` factory
building ``ParserStage(build_parser(...))`` per choice, given to the Pipeline.
"""

from __future__ import annotations

from node.pipeline.events import ContentDelta, Event, ReasoningDelta, ToolCallDelta
from node.pipeline.parsers import events as parsed_events
from node.pipeline.parsers.events import StreamParser


class ParserStage:
    """A ``TextStage`` over one choice's ``StreamParser``. Order is kept: content the parser releases before a
    reasoning or tool-call event is emitted before it; the content after the last such event is returned, to
    carry the step's logprobs and token ids (or the next stage's input)."""

    __slots__ = ("_parser",)

    def __init__(self, parser: StreamParser) -> None:
        self._parser = parser

    def feed(self, index: int, text: str, events: list[Event]) -> str:
        return _translate(index, self._parser.feed(text), events) if text else ""

    def finish(self, index: int, events: list[Event]) -> str:
        return _translate(index, self._parser.finish(), events)


def _translate(index: int, parsed: list[parsed_events.Event], events: list[Event]) -> str:
    content: list[str] = []
    for ev in parsed:
        if isinstance(ev, parsed_events.ContentDelta):
            content.append(ev.text)
            continue
        if content:
            events.append(ContentDelta(index, "".join(content)))
            content.clear()
        if isinstance(ev, parsed_events.ReasoningDelta):
            events.append(ReasoningDelta(index, ev.text))
        elif isinstance(ev, parsed_events.ToolCallStart):
            events.append(ToolCallDelta(index, ev.index, id=ev.id, name=ev.name))
        elif isinstance(ev, parsed_events.ToolCallArgsDelta):
            events.append(ToolCallDelta(index, ev.index, arguments=ev.text))
        # ToolCallEnd: a call's deltas end with the next call or the choice's Finish.
    return "".join(content)
