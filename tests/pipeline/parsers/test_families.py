"""Golden cases per family, written from each family's published format (model cards, chat templates)."""

from __future__ import annotations

import json

import pytest

from node.pipeline.parsers.calls import ToolOptions
from node.pipeline.parsers.events import (
    ContentDelta,
    ReasoningDelta,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallStart,
    text_of,
)
from node.pipeline.parsers.jsonprefix import MAX_DEPTH
from node.pipeline.parsers.registry import (
    REASONING_PARSERS,
    TOOL_PARSERS,
    UnknownParserError,
    build_parser,
)
from node.pipeline.parsers.think import prompt_opens_reasoning
from tests.pipeline.parsers._run import SAMPLES, calls, run, split, tools

WEATHER_ARGS = {"city": "Paris", "unit": "c"}
SCHEMAS = {
    "get_weather": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "unit": {"type": "string"}},
    },
    "f": {"type": "object", "properties": {}},
}


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_first_sample_is_a_weather_call(name: str) -> None:
    events = run(tools(name)(), [SAMPLES[name][0]])
    found = calls(events)
    assert found, events
    assert found[0][0] == "get_weather"
    assert json.loads(found[0][1]) == ({"city": "Beijing", "days": 3} if name == "glm45" else WEATHER_ARGS)


@pytest.mark.parametrize(
    ("name", "text", "content", "expected"),
    [
        (
            "hermes",
            'Checking.<tool_call>\n{"name": "f", "arguments": {"a": [1, "ü"]}}\n</tool_call>\n\nDone.',
            "Checking.Done.",
            [("f", '{"a": [1, "ü"]}')],
        ),
        ("hermes", '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>', "", [("f", '{"a": 1}')]),
        ("hermes", '<tool_call>{"name": "f"}</tool_call>', "", [("f", "{}")]),
        (
            "qwen3_coder",
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew\nYork\n</parameter>\n<parameter=days>\n3\n"
            "</parameter>\n</function>\n</tool_call>",
            "",
            [("get_weather", '{"city": "New\\nYork", "days": 3}')],
        ),
        (
            "glm45",
            "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>123</arg_value>\n</tool_call>",
            "",
            [("get_weather", '{"city": "123"}')],  # declared a string: stays text
        ),
        (
            "deepseek_v31",
            "Let me look.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{}<｜tool▁call▁end｜>"
            "<｜tool▁calls▁end｜>",
            "Let me look.",
            [("f", "{}")],
        ),
        ("mistral", "[TOOL_CALLS]f[CALL_ID]a1b2c3d4e[ARGS]{}", "", [("f", "{}")]),
        ("llama3_json", '<|python_tag|>{"name": "f", "arguments": {}}', "", [("f", "{}")]),
        (
            "llama4_pythonic",
            "[f(), get_weather(city='Paris', days=-2)]",
            "",
            [
                ("f", "{}"),
                ("get_weather", '{"city": "Paris", "days": -2}'),
            ],
        ),
        ("llama4_pythonic", "[f(x={1, 2})]", "[f(x={1, 2})]", []),  # a set is no JSON value
    ],
)
def test_golden(name: str, text: str, content: str, expected: list[tuple[str, str]]) -> None:
    for chunks in ([text], list(text)):
        events = run(tools(name, tools=SCHEMAS)(), chunks)
        assert text_of(events) == content
        assert calls(events) == expected


def test_event_sequence_and_ids() -> None:
    text = (
        'Hi <tool_call>{"name": "f", "arguments": {}}</tool_call><tool_call>{"name": "f", "arguments": {}}</tool_call>'
    )
    parser = build_parser(tool_parser="hermes", options=ToolOptions(id_prefix="call_abc_"))
    assert run(parser, [text]) == [
        ContentDelta("Hi "),
        ToolCallStart(0, "call_abc_0", "f"),
        ToolCallArgsDelta(0, "{}"),
        ToolCallEnd(0),
        ToolCallStart(1, "call_abc_1", "f"),
        ToolCallArgsDelta(1, "{}"),
        ToolCallEnd(1),
    ]


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_unknown_function_degrades_to_content(name: str) -> None:
    """The documented rule: a call to a function the request did not list is content, verbatim."""
    text = SAMPLES[name][0]
    events = run(tools(name, tools={"something_else": {}})(), list(text))
    assert not calls(events)
    assert text in text_of(events) or name == "openai"
    if name == "openai":  # Harmony's reasoning message stays reasoning; the call message is content
        assert text_of(events).startswith("<|start|>assistant<|channel|>commentary to=functions.get_weather")


def test_max_call_chars_bounds_what_a_call_can_hold() -> None:
    text = "a<tool_call>" + "x" * 100 + "</tool_call><tool_call>" + '{"name": "f"}</tool_call>'
    for chunks in ([text], list(text)):
        events = run(tools("hermes", max_call_chars=50)(), chunks)
        assert events == [ContentDelta(text)]  # past the bound, the rest of the output is content


def test_plain_text_streams_without_delay() -> None:
    parser = build_parser(tool_parser="hermes", reasoning_parser="qwen3")
    assert parser.feed("Hello ") == [ContentDelta("Hello ")]
    assert parser.feed("a <b") == [ContentDelta("a <b")]  # "<b" starts no marker
    assert parser.feed("c <t") == [ContentDelta("c ")]  # "<t" may start <think> or <tool_call>: it waits
    assert parser.feed("able>") == [ContentDelta("<table>")]


@pytest.mark.parametrize("name", ["qwen3", "glm45", "kimi_k2", "deepseek_r1"])
def test_think_block(name: str) -> None:
    text = "<think>\nStep 1.\n</think>\n\nAnswer."
    events = run(build_parser(reasoning_parser=name), list(text))
    assert events == [ReasoningDelta("\nStep 1.\n"), ContentDelta("\n\nAnswer.")]


def test_prompt_opened_reasoning() -> None:
    prompt = "<｜User｜>hi<｜Assistant｜><think>\n"
    assert prompt_opens_reasoning(prompt)
    assert not prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    parser = build_parser(reasoning_parser="deepseek_r1", in_reasoning=prompt_opens_reasoning(prompt))
    assert run(parser, ["Let me think.</think>The answer is 4."]) == [
        ReasoningDelta("Let me think."),
        ContentDelta("The answer is 4."),
    ]
    truncated = build_parser(reasoning_parser="deepseek_r1", in_reasoning=True)
    assert run(truncated, ["Still thinking when max_tokens hit"]) == [
        ReasoningDelta("Still thinking when max_tokens hit")
    ]


def test_reasoning_then_tool_call() -> None:
    text = (
        '<think>Need weather.</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
        "\n</tool_call>"
    )
    events = run(build_parser(tool_parser="hermes", reasoning_parser="qwen3"), split(text, [5, 17, 30, 31, 60]))
    assert text_of(events, ReasoningDelta) == "Need weather."
    assert text_of(events) == "\n\n"
    assert calls(events) == [("get_weather", '{"city": "Paris"}')]


def test_tool_call_inside_reasoning_is_reasoning() -> None:
    text = '<think><tool_call>{"name": "f", "arguments": {}}</tool_call></think>ok'
    events = run(build_parser(tool_parser="hermes", reasoning_parser="qwen3"), [text])
    assert events == [ReasoningDelta('<tool_call>{"name": "f", "arguments": {}}</tool_call>'), ContentDelta("ok")]


def test_harmony_reasoning_without_tool_parser_keeps_calls_as_content() -> None:
    text = SAMPLES["openai"][0]
    events = run(build_parser(reasoning_parser="gpt_oss"), [text])
    assert text_of(events, ReasoningDelta) == "User wants weather."
    assert not calls(events)
    assert "to=functions.get_weather" in text_of(events)


def test_harmony_call_when_stop_token_was_stripped() -> None:
    events = run(
        build_parser(tool_parser="openai"), ["<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}"]
    )
    assert calls(events) == [("f", "{}")]


def test_registry_names() -> None:
    for name in ("hermes", "llama3_json", "llama4_pythonic", "pythonic", "qwen3_coder", "deepseek_v3",
                 "deepseek_v31", "mistral", "kimi_k2", "glm45", "openai"):  # fmt: skip
        assert name in TOOL_PARSERS
    for name in ("deepseek_r1", "qwen3", "glm45", "kimi", "gpt_oss"):
        assert name in REASONING_PARSERS
    with pytest.raises(UnknownParserError, match="known: deepseek_v3"):
        build_parser(tool_parser="nope")
    with pytest.raises(UnknownParserError, match="unknown reasoning parser 'nope'"):
        build_parser(reasoning_parser="nope")
    assert run(build_parser(), ["<tool_call>x"]) == [ContentDelta("<tool_call>x")]


HOSTILE = {
    "hermes": '<tool_call>{"name": "f", "arguments": {"a": ' + "[" * 100_000 + "}}</tool_call>",
    "llama3_json": '{"name": "f", "parameters": ' + "[" * 100_000,
    "llama4_pythonic": "[f(a=" + "[" * 100_000 + ")]",
    "openai": "<|channel|>commentary to=functions.f<|message|>" + "[" * 100_000,
    "qwen3_coder": "<tool_call><function=f>" + "<parameter=a>" * 50_000 + "</tool_call>",
    "glm45": "<tool_call>f" + "<arg_key>a</arg_key>" * 50_000 + "</tool_call>",
    "deepseek_v31": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f" + " " * 200_000 + "x<｜tool▁call▁end｜>",
    "kimi_k2": "<|tool_calls_section_begin|><|tool_call_begin|>" + "functions." * 50_000 + "<|tool_call_end|>",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_output_is_content_quickly(name: str) -> None:
    """Nesting past the recursion limit and unclosed tags by the thousand: no crash, linear time, no text lost.
    A streamed call (JSON families) starts and ends at the nesting bound with what it sent; the rest is content."""
    import time

    text = HOSTILE[name]
    start = time.process_time()
    events = run(tools(name)(), [text])
    assert time.process_time() - start < 2.0
    sent = calls(events)
    assert all(args.count("[") <= MAX_DEPTH for _, args in sent)
    assert len(text_of(events)) + sum(len(args) for _, args in sent) >= len(text) - 100  # only markup dropped
