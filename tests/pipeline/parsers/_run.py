"""Helpers shared by the parser tests: run a parser over chunks, and the sample outputs per family."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

from node.pipeline.parsers.calls import ToolOptions
from node.pipeline.parsers.events import Event, StreamParser, ToolCallArgsDelta, ToolCallStart, coalesce
from node.pipeline.parsers.registry import build_parser

Factory = Callable[[], StreamParser]


def run(parser: StreamParser, chunks: Sequence[str]) -> list[Event]:
    events: list[Event] = []
    for chunk in chunks:
        events += parser.feed(chunk)
    events += parser.finish()
    return coalesce(events)


def split(text: str, cuts: Sequence[int]) -> list[str]:
    points = sorted({min(max(c, 0), len(text)) for c in cuts})
    bounds = [0, *points, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


def tools(name: str | None = None, reasoning: str | None = None, **options: object) -> Factory:
    opts = ToolOptions(**options)  # type: ignore[arg-type]
    return lambda: build_parser(tool_parser=name, reasoning_parser=reasoning, options=opts)


def calls(events: Sequence[Event]) -> list[tuple[str, str]]:
    """(name, arguments) per call, arguments concatenated over their deltas."""
    names = {e.index: e.name for e in events if isinstance(e, ToolCallStart)}
    args = {i: "".join(e.text for e in events if isinstance(e, ToolCallArgsDelta) and e.index == i) for i in names}
    return [(names[i], args[i]) for i in sorted(names)]


WEATHER = '{"city": "Paris", "unit": "c"}'
# Sample outputs per tool-call parser: valid, several calls, content around, and malformed ones.
SAMPLES: dict[str, list[str]] = {
    "hermes": [
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}'
        "\n</tool_call>",
        '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n<tool_call>\n{"name": "b", "arguments": {"x": 1}}'
        "\n</tool_call>\n",
        "a < b and <tool_ca but no call, <tool_call>{not json}</tool_call> tail",
        'x <tool_call>{"name": "get_weather", "arguments": {"city": "Pa',
        "emoji 😀 and 中文 <tool_call>",
        # Streamed calls that break after their start, carry extra keys, or put the arguments first.
        '<tool_call>{"name": "f", "arguments": {"a": [1, -2.5e3, "\\u00e9 😀"] oops}}</tool_call> tail',
        '<tool_call>{"name": "f", "arguments": {"b": true}, "x": 1}</tool_call><tool_call>{"arguments": {}, '
        '"name": "g"}</tool_call>',
    ],
    "qwen3_coder": [
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=unit>\nc\n"
        "</parameter>\n</function>\n</tool_call>",
        "Sure.<tool_call>\n<function=f>\n</function>\n</tool_call> then <tool_call><function=g>junk</function>"
        "</tool_call>",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
        # Streamed per parameter: one breaks after the first parameter, one has text after </function>.
        "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n junk <parameter=b>\n2\n</parameter>\n"
        "</function>\n</tool_call>tail<tool_call><function=a><parameter=x>😀</parameter></function>x</tool_call>",
    ],
    "glm45": [
        "Checking.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Beijing</arg_value>\n"
        "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>",
        "<tool_call>f</tool_call><tool_call>bad name\n<arg_key>k</arg_key></tool_call>",
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_val",
        "<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>[1, 2]</arg_value> stray <arg_key>b</arg_key>"
        "<arg_value>x</arg_value></tool_call>after<tool_call>a<arg_key>k</arg_key> x <arg_value>v</arg_value>"
        "</tool_call>",
    ],
    "deepseek_v3": [
        "Sure<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
        + WEATHER
        + "\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{}\n```<｜tool▁call▁end｜>"
        "<｜tool▁calls▁end｜>",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{bad\n```<｜tool▁call▁end｜>"
        "<｜tool▁calls▁end｜> after",
        '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{"ci',
        "<｜tool▁calls▁begin｜><｜tool▁calls▁end｜>",
        '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{"a": null}\n`` x'
        "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    ],
    "deepseek_v31": [
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
        + WEATHER
        + "<｜tool▁call▁end｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        "text <｜tool▁calls▁begin｜> stray <｜tool▁call▁begin｜>f<｜tool▁sep｜>[1]<｜tool▁call▁end｜>",
    ],
    "kimi_k2": [
        "Let me see.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
        + WEATHER
        + "<|tool_call_end|><|tool_call_begin|>functions.f:1<|tool_call_argument_begin|>{}<|tool_call_end|>"
        "<|tool_calls_section_end|>",
        "<|tool_calls_section_begin|><|tool_call_begin|>nonsense<|tool_call_end|><|tool_calls_section_end|>",
    ],
    "mistral": [
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}, {"name": "f", '
        '"arguments": {}}]',
        "Sure. [TOOL_CALLS]get_weather[ARGS]" + WEATHER + "[TOOL_CALLS]f[ARGS]{}",
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Pa',
        "[TOOL_CALLS] not a call",
    ],
    "llama3_json": [
        '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "c"}}',
        '<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"x": [1, 2]}}',
        '  {"name": "get_weather", "parameters": {"ci',
        "{ this is content that starts with a brace }",
        "Plain answer with { braces } later.",
        '{"name": "a", "parameters": {"x": 1}} ; {"name": "b", "parameters": {"y": "z"} oops',
        '{"name": "a", "parameters": {"x": 1}}; {"parameters": {}, "name": "b"}; trailing prose',
    ],
    "llama4_pythonic": [
        '[get_weather(city="Paris", unit="c"), f()]',
        '<|python_start|>[get_weather(city="Paris")]<|python_end|>',
        "[1] is a citation, not a call",
        '[get_weather(city="Pa',
        "Content first [f()]",
    ],
    "openai": [
        "<|channel|>analysis<|message|>User wants weather.<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris", "unit": "c"}<|call|>',
        "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Answer 😀.<|return|>",
        "<|channel|>commentary to=functions.f<|message|>{bad<|call|>",
        "<|channel|>commentary<|message|>Preamble.<|end|><|start|>assistant<|channel|>commentary to=browser.search"
        '<|message|>{"q": 1}<|call|>',
        "<|channel|>commentary to=functions.get_weather json<|message|>" + WEATHER,
        "no harmony at all <|chan",
        '<|channel|>commentary to=functions.f<|message|>{"a": nul!}<|call|><|channel|>final<|message|>ok',
    ],
}
