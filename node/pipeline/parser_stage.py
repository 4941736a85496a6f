"""The output parsers (node/pipeline/parsers/) as a text stage of the Output stage: one choice's parser turns
its text into the pipeline's typed events (reasoning, tool calls), content passing on.

Which parsers a request gets is Prepare's decision (``GenerateSpec.parsing``, a ``ParserPlan``);
``parser_stages`` is the per-choice factory the Pipeline gives the Output stage by default.
"""

from __future__ import annotations

from collections.abc import Sequence

from node.pipeline.events import ContentDelta, Event, ReasoningDelta, ToolCallDelta
from node.pipeline.parsers import events as parsed_events
from node.pipeline.parsers.calls import ToolOptions
from node.pipeline.parsers.chain import ChainedParser
from node.pipeline.parsers.events import StreamParser
from node.pipeline.parsers.forced import NamedCallParser, RequiredCallsParser
from node.pipeline.parsers.registry import build_parser
from node.pipeline.spec import GenerateSpec


class ParserStage:
    """A ``TextStage`` over one choice's ``StreamParser``. Order is kept: content the parser releases before a
    reasoning or tool-call event is emitted before it; the content after the last such event is returned, to
    carry the step's logprobs and token ids (or the next stage's input).

    ``max_calls``: calls past this many are dropped whole (``parallel_tool_calls: false`` keeps the first).

    The newlines a model writes between its reasoning block and its answer (``</think>\n\n``) are layout,
    not answer: they are dropped, as the families' own templates drop them when rendering the turn back.
    """

    __slots__ = ("_max_calls", "_parser", "_trim")

    def __init__(self, parser: StreamParser, *, max_calls: int | None = None) -> None:
        self._parser = parser
        self._max_calls = max_calls
        self._trim = False  # reasoning was seen and no answer text yet: leading newlines are dropped

    def feed(self, index: int, text: str, events: list[Event]) -> str:
        if not text:
            return ""
        parsed = self._parser.feed(text)
        # The hot path: text without markup comes back as one content delta.
        if len(parsed) == 1 and type(first := parsed[0]) is parsed_events.ContentDelta and not self._trim:
            return first.text
        return self._translate(index, parsed, events)

    def finish(self, index: int, events: list[Event]) -> str:
        return self._translate(index, self._parser.finish(), events)

    def _translate(self, index: int, parsed: list[parsed_events.Event], events: list[Event]) -> str:
        content: list[str] = []
        limit = self._max_calls
        for ev in parsed:
            if isinstance(ev, parsed_events.ContentDelta):
                text = ev.text
                if self._trim:
                    text = text.lstrip("\n")
                    self._trim = not text
                content.append(text)
                continue
            if limit is not None and not isinstance(ev, parsed_events.ReasoningDelta) and ev.index >= limit:
                continue
            if content:
                events.append(ContentDelta(index, "".join(content)))
                content.clear()
            if isinstance(ev, parsed_events.ReasoningDelta):
                events.append(ReasoningDelta(index, ev.text))
                self._trim = True
            elif isinstance(ev, parsed_events.ToolCallStart):
                events.append(ToolCallDelta(index, ev.index, id=ev.id, name=ev.name))
            elif isinstance(ev, parsed_events.ToolCallArgsDelta):
                events.append(ToolCallDelta(index, ev.index, arguments=ev.text))
            # ToolCallEnd: a call's deltas end with the next call or the choice's Finish.
        return "".join(content)


def parser_stages(spec: GenerateSpec) -> Sequence[ParserStage]:
    """The text stages of one choice of ``spec``: its parser, or none when the request needs no parsing."""
    plan = spec.parsing
    if plan is None:
        return ()
    options = ToolOptions(tools=plan.tools, id_prefix=f"call_{spec.request_id[-12:]}_")
    forced = plan.forced
    parser = build_parser(
        tool_parser=plan.tool_parser if forced is None else None,
        reasoning_parser=plan.reasoning_parser,
        options=options,
        in_reasoning=plan.in_reasoning,
    )
    if forced is not None:
        calls: StreamParser = (
            RequiredCallsParser(options) if forced == "required" else NamedCallParser(forced.name, options)
        )
        # Reasoning first (a thinking model thinks before the constrained answer), then the forced call(s).
        parser = ChainedParser(parser, calls) if plan.reasoning_parser is not None else calls
    return (ParserStage(parser, max_calls=plan.max_calls),)
