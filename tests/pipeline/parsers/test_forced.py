"""Calls the engine was constrained to write (tool_choice required / named): bare JSON read back as calls,
the same for any chunking; anything else degrades to content."""

from __future__ import annotations

import itertools
import json

from hypothesis import given
from hypothesis import strategies as st

from node.pipeline.parsers.calls import ToolOptions
from node.pipeline.parsers.events import (
    ContentDelta,
    Event,
    StreamParser,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallStart,
    coalesce,
)
from node.pipeline.parsers.forced import NamedCallParser, RequiredCallsParser

TOOLS = ToolOptions(tools={"get_weather": {}, "get_time": {}})
REQUIRED = '[{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "get_time", "parameters": {}}]'


def _run(parser: StreamParser, text: str, cuts: list[int]) -> list[Event]:
    bounds = [0, *sorted(c % (len(text) + 1) for c in cuts), len(text)]
    events: list[Event] = []
    for a, b in itertools.pairwise(bounds):
        events += parser.feed(text[a:b])
    return coalesce(events + parser.finish())


@given(st.lists(st.integers(0, 200), max_size=8))
def test_a_named_call_streams_its_arguments_for_any_chunking(cuts: list[int]) -> None:
    args = '{"city": "Paris – Île-de-France"}'
    events = _run(NamedCallParser("get_weather", ToolOptions(id_prefix="call_x_")), args, cuts)
    assert events == [ToolCallStart(0, "call_x_0", "get_weather"), ToolCallArgsDelta(0, args), ToolCallEnd(0)]


def test_a_named_call_starts_with_the_first_text() -> None:
    parser = NamedCallParser("get_weather", TOOLS)
    assert parser.feed('{"ci') == [ToolCallStart(0, "call_0", "get_weather"), ToolCallArgsDelta(0, '{"ci')]
    assert parser.feed('ty": 1}') == [ToolCallArgsDelta(0, 'ty": 1}')]
    empty = NamedCallParser("get_time", TOOLS)
    assert coalesce(empty.finish()) == [
        ToolCallStart(0, "call_0", "get_time"),
        ToolCallArgsDelta(0, "{}"),
        ToolCallEnd(0),
    ]


@given(st.lists(st.integers(0, 200), max_size=8))
def test_required_calls_parse_whole_for_any_chunking(cuts: list[int]) -> None:
    events = _run(RequiredCallsParser(TOOLS), REQUIRED, cuts)
    starts = [(e.index, e.name) for e in events if isinstance(e, ToolCallStart)]
    args = [json.loads(e.text) for e in events if isinstance(e, ToolCallArgsDelta)]
    assert starts == [(0, "get_weather"), (1, "get_time")] and args == [{"city": "Paris"}, {}]


def test_required_output_that_is_not_calls_stays_content() -> None:
    for text in (REQUIRED[:-5], '[{"name": "nope", "parameters": {}}]', '{"name": "get_time"}', "plain"):
        assert _run(RequiredCallsParser(TOOLS), text, [3]) == [ContentDelta(text)]
    tiny = RequiredCallsParser(ToolOptions(max_call_chars=8))
    assert coalesce(tiny.feed("[" * 5) + tiny.feed("[" * 5) + tiny.feed("x") + tiny.finish()) == [
        ContentDelta("[" * 10 + "x")
    ]
