"""Tool-call arguments stream as the model writes them (argstream.py): a call starts once its name is known
and its arguments begin, fragments follow before the end marker arrives, and what happens to a started call
that breaks, is cut short or outgrows the bound is fixed per prefix."""

from __future__ import annotations

import json

import pytest

from node.pipeline.parsers.events import (
    ContentDelta,
    Event,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallStart,
    coalesce,
    text_of,
)
from tests.pipeline.parsers._run import calls, run, tools

ARGS = '{"city": "Paris", "days": [1, 2], "note": "a \\"quoted\\" é"}'
# (parser, text before the arguments, text after them up to and including the call's end)
STREAMED = {
    "hermes": ('<tool_call>\n{"name": "get_weather", "arguments": ', "}\n</tool_call>"),
    "deepseek_v3": (
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n",
        "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    ),
    "deepseek_v31": (
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>",
        "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    ),
    "kimi_k2": (
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>",
        "<|tool_call_end|><|tool_calls_section_end|>",
    ),
    "mistral": ("[TOOL_CALLS]get_weather[ARGS]", ""),
    "llama3_json": ('<|python_tag|>{"name": "get_weather", "parameters": ', "}"),
    "openai": ("<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>", "<|call|>"),
}


@pytest.mark.parametrize("name", sorted(STREAMED))
def test_fragments_arrive_before_the_call_closes(name: str) -> None:
    head, tail = STREAMED[name]
    parser = tools(name)()
    events: list[Event] = parser.feed(head)
    assert events == [] or not any(isinstance(e, ToolCallArgsDelta) for e in events)
    fragments = []
    for piece in (ARGS[:10], ARGS[10:25], ARGS[25:]):  # the arguments arrive in three pieces
        new = parser.feed(piece)
        assert not any(isinstance(e, ToolCallEnd) for e in new)
        fragments += [e.text for e in new if isinstance(e, ToolCallArgsDelta)]
        events += new
    assert len(fragments) == 3 and "".join(fragments) == ARGS  # each piece released as it came
    assert isinstance(events[0], ToolCallStart) and events[0].name == "get_weather"
    end = parser.feed(tail) + parser.finish()
    assert [e for e in end if not isinstance(e, ContentDelta)] == [ToolCallEnd(0)]
    assert calls(coalesce(events + end)) == [("get_weather", ARGS)]  # the model's own text, whitespace kept
    assert json.loads(ARGS)


def test_start_needs_the_name_and_the_arguments_brace() -> None:
    parser = tools("hermes")()
    assert parser.feed('<tool_call>{"name": "f", "argum') == []
    assert parser.feed('ents": ') == []
    assert parser.feed("{") == [ToolCallStart(0, "call_0", "f"), ToolCallArgsDelta(0, "{")]
    assert parser.feed('"a": 12') == [ToolCallArgsDelta(0, '"a": 12')]  # a number prefix is a JSON prefix
    assert parser.feed("}}</tool_call>after") == [ToolCallArgsDelta(0, "}"), ToolCallEnd(0), ContentDelta("after")]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # JSON broken after the start: the call ends with what was sent, the rest is content, marker included.
        (
            '<tool_call>{"name": "f", "arguments": {"a": 1 oops}}</tool_call> tail',
            [
                ToolCallStart(0, "call_0", "f"),
                ToolCallArgsDelta(0, '{"a": 1 '),
                ToolCallEnd(0),
                ContentDelta("oops}}</tool_call> tail"),
            ],
        ),
        # Cut by max_tokens: the call ends with the arguments sent so far (OpenAI's finish_reason "length").
        (
            '<tool_call>{"name": "f", "arguments": {"a": "Pa',
            [ToolCallStart(0, "call_0", "f"), ToolCallArgsDelta(0, '{"a": "Pa'), ToolCallEnd(0)],
        ),
        # The end marker inside unfinished arguments: the model closed the call.
        (
            '<tool_call>{"name": "f", "arguments": {"a": 1</tool_call>x',
            [ToolCallStart(0, "call_0", "f"), ToolCallArgsDelta(0, '{"a": 1'), ToolCallEnd(0), ContentDelta("x")],
        ),
        # Text after the arguments that is not the wrapper's close: content after the call's end.
        (
            '<tool_call>{"name": "f", "arguments": {}, "x": 1}</tool_call>',
            [
                ToolCallStart(0, "call_0", "f"),
                ToolCallArgsDelta(0, "{}"),
                ToolCallEnd(0),
                ContentDelta(', "x": 1}</tool_call>'),
            ],
        ),
        # "arguments" before "name": held and decided whole at the end marker, as before.
        (
            '<tool_call>{"arguments": {"a": 1}, "name": "f"}</tool_call>',
            [ToolCallStart(0, "call_0", "f"), ToolCallArgsDelta(0, '{"a": 1}'), ToolCallEnd(0)],
        ),
    ],
)
def test_started_call_rules(text: str, expected: list[Event]) -> None:
    for chunks in ([text], list(text)):
        assert run(tools("hermes")(), chunks) == expected


def test_llama3_json_calls_stream_one_after_another() -> None:
    parser = tools("llama3_json")()
    assert parser.feed('{"name": "a", "parameters": {"x"') == [
        ToolCallStart(0, "call_0", "a"),
        ToolCallArgsDelta(0, '{"x"'),
    ]
    assert parser.feed(': 1}}; {"name": "b", "parameters": {') == [
        ToolCallArgsDelta(0, ": 1}"),
        ToolCallEnd(0),  # the wrapper's "}" ends the call at once
        ToolCallStart(1, "call_1", "b"),
        ToolCallArgsDelta(1, "{"),
    ]
    assert parser.feed("}} and then prose") == [ToolCallArgsDelta(1, "}"), ToolCallEnd(1)]
    assert parser.finish() == [ContentDelta(" and then prose")]  # not a call: content, verbatim


def test_unknown_name_is_held_and_degrades_to_content() -> None:
    text = '<tool_call>{"name": "nope", "arguments": {"a": 1}}</tool_call>'
    parser = tools("hermes", tools={"f": {}})()
    assert [e for c in text for e in parser.feed(c)] + parser.finish() == [ContentDelta(text)]


def test_a_started_call_past_the_bound_ends_there() -> None:
    text = '<tool_call>{"name": "f", "arguments": {"a": "' + "x" * 100 + '"}}</tool_call> rest'
    for chunks in ([text], list(text)):
        events = run(tools("hermes", max_call_chars=80)(), chunks)
        (call,) = calls(events)
        assert text.startswith('<tool_call>{"name": "f", "arguments": ' + call[1])
        assert len(call[1]) + len('<tool_call>{"name": "f", "arguments": ') == 80
        assert text_of(events) == text[80:]  # the rest of the output is content


def test_a_bound_below_the_markup_never_starts_a_call() -> None:
    """Regression: a bound smaller than the call's own markup (Harmony header, block markers) left a negative
    room that sliced from the end and started the call on one split only."""
    text = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>" + ARGS + "<|call|>"
    for chunks in ([text], list(text), [text[:80], text[80:]]):
        assert run(tools("openai", max_call_chars=60)(), chunks) == [ContentDelta(text)]
    block = "<tool_call>" + '{"name": "f", "arguments": {"a": 1}}</tool_call>'
    for chunks in ([block], list(block), [block[:40], block[40:]]):
        assert run(tools("hermes", max_call_chars=8)(), chunks) == [ContentDelta(block)]


def test_qwen3_coder_releases_each_parameter_as_it_closes() -> None:
    schemas = {"get_weather": {"type": "object", "properties": {"days": {"type": "integer"}}}}
    parser = tools("qwen3_coder", tools=schemas)()
    assert parser.feed("<tool_call>\n<function=get_weather>\n<parameter=city>\nPar") == [
        ToolCallStart(0, "call_0", "get_weather")  # the name first, as soon as the function tag is complete
    ]
    assert parser.feed("is\n</parameter>\n<parameter=days>\n3") == [ToolCallArgsDelta(0, '{"city": "Paris"')]
    assert parser.feed("\n</parameter>\n") == [ToolCallArgsDelta(0, ', "days": 3')]  # typed by the schema
    assert parser.feed("</function>\n</tool_call>") == [ToolCallArgsDelta(0, "}"), ToolCallEnd(0)]
    # The fragments concatenate to what the whole-block parser writes.
    assert calls(run(tools("qwen3_coder", tools=schemas)(), [SAMPLE_CODER])) == [
        ("get_weather", '{"city": "Paris", "days": 3}')
    ]


SAMPLE_CODER = (
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n"
    "</parameter>\n</function>\n</tool_call>"
)


def test_qwen3_coder_started_call_rules() -> None:
    text = "<tool_call><function=f><parameter=a>1</parameter> junk </function></tool_call> tail"
    for chunks in ([text], list(text)):
        assert run(tools("qwen3_coder")(), chunks) == [
            ToolCallStart(0, "call_0", "f"),
            ToolCallArgsDelta(0, '{"a": "1"'),
            ToolCallEnd(0),
            ContentDelta("junk </function></tool_call> tail"),
        ]
    cut = "<tool_call><function=f><parameter=a>1</parameter><parameter=b>unfinished"
    for chunks in ([cut], list(cut)):
        assert run(tools("qwen3_coder")(), chunks) == [
            ToolCallStart(0, "call_0", "f"),
            ToolCallArgsDelta(0, '{"a": "1"'),
            ToolCallEnd(0),
            ContentDelta("<parameter=b>unfinished"),  # the open parameter is not lost
        ]


def test_glm45_releases_each_pair_and_closes_at_the_end_marker() -> None:
    parser = tools("glm45")()
    assert parser.feed("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Bei") == [
        ToolCallStart(0, "call_0", "get_weather")
    ]
    assert parser.feed("jing</arg_value>\n<arg_key>days</arg_key><arg_value>3</arg_value>") == [
        ToolCallArgsDelta(0, '{"city": "Beijing"'),
        ToolCallArgsDelta(0, ', "days": 3'),  # undeclared: JSON when it parses, as GLM's parser
    ]
    assert parser.feed("\n</tool_call>") == [ToolCallArgsDelta(0, "}"), ToolCallEnd(0)]
    cut = tools("glm45")()
    cut.feed("<tool_call>f\n<arg_key>a</arg_key><arg_value>1</arg_value>")
    assert cut.finish() == [ToolCallEnd(0)]  # cut by the end of output: the arguments as sent, no "}"
