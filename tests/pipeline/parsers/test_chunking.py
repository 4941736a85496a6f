"""Chunk-boundary invariance: any split of an output into feeds gives the same (coalesced) events."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from node.pipeline.parsers.events import ContentDelta, ReasoningDelta, ToolCallStart, text_of
from tests.pipeline.parsers._run import SAMPLES, run, split, tools

# Fragments that make up adversarial outputs: every family's markers, pieces of them, JSON and XML bits,
# multi-byte characters and whitespace, so random concatenations hit markers split anywhere.
_FRAGMENTS = [
    "<tool_call>",
    "</tool_call>",
    "<tool_",
    "<think>",
    "</think>",
    "</thi",
    "<function=f>",
    "</function>",
    "<parameter=a>",
    "</parameter>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁calls▁end｜>",
    "<|tool_calls_section_begin|>",
    "<|tool_call_begin|>",
    "functions.f:0",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
    "<|tool_calls_section_end|>",
    "[TOOL_CALLS]",
    "[ARGS]",
    "<|python_tag|>",
    "<|python_start|>",
    "<|channel|>",
    "analysis",
    "final",
    " to=functions.f",
    "<|message|>",
    "<|end|>",
    "<|start|>",
    "<|call|>",
    '{"name": "f", "arguments": {"a": 1}}',
    # Heads of streamed calls and argument pieces, so calls start and then continue, close or break anywhere.
    '{"name": "f", "arguments": ',
    '{"name": "f", "parameters": ',
    "f[ARGS]",
    "get_weather<｜tool▁sep｜>",
    '"a"',
    ": ",
    ", ",
    "-1.5e3",
    "tru",
    "\\u00e",
    ";",
    '{"a": 1}',
    "f(a=1)",
    "[",
    "]",
    "{",
    "}",
    "\n",
    "  ",
    "function",
    "```json\n",
    "\n```",
    "f",
    "x",
    "<",
    "|",
    "😀",
    "中文",
]
_garbage = st.lists(st.sampled_from(_FRAGMENTS), max_size=24).map("".join)
_cuts = st.lists(st.integers(min_value=0, max_value=600), max_size=12)
_TOOL_NAMES = sorted(SAMPLES)
_REASONING = ["qwen3", "deepseek_r1", "glm45", "kimi_k2", "gpt_oss"]


@given(name=st.sampled_from(_TOOL_NAMES), data=st.data(), cuts=_cuts, bound=st.sampled_from([1 << 20, 30, 60]))
@settings(max_examples=400, deadline=None)
def test_tool_parsers_ignore_chunk_boundaries_on_samples(
    name: str, data: st.DataObject, cuts: list[int], bound: int
) -> None:
    sample = data.draw(st.sampled_from(SAMPLES[name]))
    cut = data.draw(st.integers(min_value=0, max_value=len(sample)))
    for text in (sample, sample[:cut]):  # the whole output, and one truncated anywhere (max_tokens)
        factory = tools(name, max_call_chars=bound)
        assert run(factory(), split(text, cuts)) == run(factory(), [text])


@given(name=st.sampled_from(_TOOL_NAMES), data=st.data(), cuts=_cuts, bound=st.sampled_from([1 << 20, 30, 60]))
@settings(max_examples=300, deadline=None)
def test_tool_lists_do_not_make_chunking_matter(name: str, data: st.DataObject, cuts: list[int], bound: int) -> None:
    """With a tool list, a name not on it is held (a streamed call never starts for it), for any split."""
    sample = data.draw(st.sampled_from(SAMPLES[name]))
    text = sample[: data.draw(st.integers(min_value=0, max_value=len(sample)))]
    factory = tools(name, max_call_chars=bound, tools={"f": {}, "a": {}})
    assert run(factory(), split(text, cuts)) == run(factory(), [text])


@given(name=st.sampled_from(_TOOL_NAMES), text=_garbage, cuts=_cuts, bound=st.sampled_from([1 << 20, 8, 40]))
@settings(max_examples=600, deadline=None)
def test_tool_parsers_ignore_chunk_boundaries_on_markup_soup(name: str, text: str, cuts: list[int], bound: int) -> None:
    factory = tools(name, max_call_chars=bound)  # small bounds: calls overflow at every possible point
    assert run(factory(), split(text, cuts)) == run(factory(), [text])


@given(text=st.sampled_from([s for samples in SAMPLES.values() for s in samples]), data=st.data())
@settings(max_examples=200, deadline=None)
def test_one_character_feeds_match_whole_output(text: str, data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(_TOOL_NAMES))
    factory = tools(name)
    assert run(factory(), list(text)) == run(factory(), [text])


@given(reasoning=st.sampled_from(_REASONING), tool=st.sampled_from([None, *_TOOL_NAMES]), text=_garbage, cuts=_cuts)
@settings(max_examples=400, deadline=None)
def test_chained_parsers_ignore_chunk_boundaries(reasoning: str, tool: str | None, text: str, cuts: list[int]) -> None:
    factory = tools(tool, reasoning)
    assert run(factory(), split(text, cuts)) == run(factory(), [text])


@given(
    reasoning=st.sampled_from(["qwen3", "deepseek_r1", "glm45", "kimi_k2"]),
    text=_garbage,
    cuts=_cuts,
    in_reasoning=st.booleans(),
)
@settings(max_examples=300, deadline=None)
def test_think_parser_loses_only_its_markers(reasoning: str, text: str, cuts: list[int], in_reasoning: bool) -> None:
    from node.pipeline.parsers.registry import build_parser

    events = run(build_parser(reasoning_parser=reasoning, in_reasoning=in_reasoning), split(text, cuts))
    body = text_of(events, ReasoningDelta) + text_of(events, ContentDelta)
    # At most one <think> (when not already inside) and one </think> are consumed; order is preserved.
    removed = len(text) - len(body)
    assert removed in {0, len("<think>"), len("</think>"), len("<think>") + len("</think>")}
    assert all(isinstance(e, ContentDelta | ReasoningDelta) for e in events)


@given(
    name=st.sampled_from([n for n in _TOOL_NAMES if n != "openai"]),
    text=_garbage,
    cuts=_cuts,
    bound=st.sampled_from([1 << 20, 8, 40]),
)
@settings(max_examples=400, deadline=None)
def test_output_without_calls_is_content_verbatim(name: str, text: str, cuts: list[int], bound: int) -> None:
    events = run(tools(name, max_call_chars=bound)(), split(text, cuts))
    if not any(isinstance(e, ToolCallStart) for e in events):
        assert events == ([ContentDelta(text)] if text else [])


@given(name=st.sampled_from(_TOOL_NAMES), data=st.data())
@settings(max_examples=300, deadline=None)
def test_truncated_call_keeps_its_text(name: str, data: st.DataObject) -> None:
    """max_tokens anywhere: whatever was not emitted as a call is in the content, in order."""
    sample = data.draw(st.sampled_from(SAMPLES[name]))
    text = sample[: data.draw(st.integers(min_value=0, max_value=len(sample)))]
    events = run(tools(name)(), list(text))
    content = text_of(events, ContentDelta)
    # Content is a subsequence of the output (only markup of emitted calls and reasoning is taken out).
    remaining = iter(text)
    assert all(ch in remaining for ch in content)


# Cases the properties above found: a call cut by max_call_chars with a marker prefix at the cut.
@pytest.mark.parametrize(
    ("name", "text", "cut", "tool_list", "expected"),
    [
        # The stream saw past the bound: the blank before a parameter tag was dropped only when the whole
        # tag had arrived.
        ("qwen3_coder", "<tool_call>\n<function=f>\n<parameter=", 31, {"f": {}}, "\n<parameter="),
        # A spilled body took a "<" that began its <|call|>: the message never ended, the final channel's
        # markup became content.
        (
            "openai",
            '<|channel|>commentary to=functions.f<|message|>{"a": nul!}<|call|><|channel|>final<|message|>ok',
            59,
            None,
            '<|channel|>commentary to=functions.f<|message|>{"a": nul!}<|call|>ok',
        ),
    ],
)
def test_an_overflowing_call_ends_alike_however_it_is_split(
    name: str, text: str, cut: int, tool_list: dict[str, dict[str, object]] | None, expected: str
) -> None:
    factory = tools(name, max_call_chars=30, **({"tools": tool_list} if tool_list is not None else {}))
    whole = run(factory(), [text])
    assert run(factory(), split(text, [cut])) == whole
    assert text_of(whole) == expected
