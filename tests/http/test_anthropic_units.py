"""The Anthropic adapter's pure parts: request mapping (tool_choice, thinking, prefill, blocks), the block
assembler's chunk invariance, and the idle ping."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from node.errors import InvalidRequest
from node.http import anthropic_messages
from node.http.anthropic_blocks import Blocks, MessageSink
from node.http.anthropic_request import messages_request
from node.http.anthropic_types import MessagesRequest
from node.http.sse import SseStream
from node.pipeline.request import ChatPrompt, NamedTool

TOOL = {"name": "f", "input_schema": {"type": "object"}}


def req(**kw: Any) -> MessagesRequest:
    body = {"model": "m", "max_tokens": 2048, "messages": [{"role": "user", "content": "hi"}], **kw}
    return msgspec.convert(body, MessagesRequest)


def prompt_of(r: MessagesRequest) -> ChatPrompt:
    p = messages_request(r).prompts[0]
    assert isinstance(p, ChatPrompt)
    return p


@pytest.mark.parametrize(
    ("choice", "expected", "parallel", "rendered"),
    [
        ({"type": "auto"}, "auto", True, True),
        ({"type": "any"}, "required", True, True),
        ({"type": "tool", "name": "f"}, NamedTool("f"), True, True),
        ({"type": "none"}, "none", True, False),
        ({"type": "auto", "disable_parallel_tool_use": True}, "auto", False, True),
    ],
)
def test_tool_choice_maps_onto_the_pipeline(choice: Any, expected: Any, parallel: bool, rendered: bool) -> None:
    r = messages_request(req(tools=[TOOL], tool_choice=choice))
    assert r.tools is not None and r.tools.choice == expected and r.tools.parallel is parallel
    p = r.prompts[0]
    assert isinstance(p, ChatPrompt) and (p.tools is not None) is rendered, "none: the tools are not offered"
    if rendered:
        assert p.tools == [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize(
    ("kw", "param"),
    [
        ({"tool_choice": {"type": "tool", "name": "g"}, "tools": [TOOL]}, "tool_choice.name"),
        ({"tool_choice": {"type": "any"}}, "tool_choice"),
        ({"tools": [TOOL, TOOL]}, "tools.1.name"),
        ({"tools": [{"name": "web", "type": "web_search_20250305"}]}, "tools.0.type"),
        ({"thinking": {"type": "enabled"}}, "thinking.budget_tokens"),
        ({"thinking": {"type": "enabled", "budget_tokens": 4096}}, "max_tokens"),
        ({"temperature": 1.5}, "temperature"),
        ({"system": [{"type": "image"}]}, "system.0.type"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "user", "content": [{"type": "tool_result"}]}]}, "messages.0.content.0.tool_use_id"),
        ({"messages": [{"role": "user", "content": [{"type": "audio"}]}]}, "messages.0.content.0.type"),
        ({"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "x"}]}]}, "messages.0.content.0"),
    ],
)
def test_bad_requests_name_the_field(kw: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        messages_request(req(**kw))
    assert err.value.param == param


def test_thinking_switches_the_template() -> None:
    assert prompt_of(req()).template_kwargs == {"enable_thinking": False}
    enabled = messages_request(req(thinking={"type": "enabled", "budget_tokens": 1024}))
    assert enabled.reasoning_budget == 1024
    assert isinstance(p := enabled.prompts[0], ChatPrompt) and p.template_kwargs == {"enable_thinking": True}
    assert prompt_of(req(thinking={"type": "adaptive"})).template_kwargs is None


def test_a_final_assistant_turn_is_a_prefill() -> None:
    p = prompt_of(req(messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure,"}]))
    assert p.continue_final_message and not p.add_generation_prompt


def test_blocks_become_template_messages() -> None:
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "t", "signature": "s"},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": "c"},
                {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"x": 1}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "r", "is_error": True},
                {"type": "text", "text": "d"},
            ],
        },
    ]
    p = prompt_of(req(system="sys", messages=messages, tools=[TOOL]))
    assert list(p.messages) == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "a\nb"},
        {
            "role": "assistant",
            "content": "c",
            "reasoning_content": "t",
            "tool_calls": [{"id": "toolu_1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "Error: r"},
        {"role": "user", "content": "d"},
    ]


Piece = tuple[str, str]
PIECES: list[Piece] = [
    ("thinking", "Let me "),
    ("thinking", "think."),
    ("text", "\n\n"),
    ("text", "Answer: 4."),
    ("tool", '{"a": '),
    ("tool", "1}"),
    ("text", " \n"),
    ("text", "after"),
    ("tool2", "{}"),
]


def assemble(pieces: list[Piece]) -> list[dict[str, Any]]:
    sink = MessageSink()
    blocks = Blocks(sink)
    for kind, text in pieces:
        if kind == "thinking":
            blocks.thinking(text)
        elif kind == "text":
            blocks.text(text)
        else:
            blocks.tool(0 if kind == "tool" else 1, kind, text)
    blocks.close()
    return [{k: v for k, v in b.items() if k != "id"} for b in sink.content]


@given(st.lists(st.integers(0, 12), max_size=12))
def test_block_boundaries_do_not_depend_on_chunking(cuts: list[int]) -> None:
    """Splitting any delta anywhere gives the same blocks."""
    split: list[Piece] = []
    for k, (kind, text) in enumerate(PIECES):
        at = cuts[k] if k < len(cuts) else 0
        split += [(kind, text[:at]), (kind, text[at:])]
    assert assemble(split) == assemble(PIECES)
    blocks = assemble(PIECES)
    assert [b["type"] for b in blocks] == ["thinking", "text", "tool_use", "text", "tool_use"]
    assert blocks[1]["text"] == "Answer: 4." and blocks[3]["text"] == "after", "separators are not text"
    assert blocks[2]["input"] == {"a": 1} and blocks[0]["signature"]


class _Writer:
    def __init__(self) -> None:
        self.data: list[bytes] = []

    async def write(self, data: bytes) -> None:
        self.data.append(data)

    async def write_eof(self, data: bytes = b"") -> None:
        self.data.append(data)


async def test_an_idle_stream_is_pinged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(anthropic_messages, "PING_INTERVAL_S", 0.01)
    writer = _Writer()
    pinger = anthropic_messages._Pinger(SseStream(writer))
    task = asyncio.create_task(pinger.run())
    await asyncio.sleep(0.1)
    idle = len(writer.data)
    for _ in range(10):  # a busy stream: every interval saw a write
        pinger.writes += 1
        await asyncio.sleep(0.005)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert idle >= 3 and all(d == b'event: ping\ndata: {"type":"ping"}\n\n' for d in writer.data)
    assert len(writer.data) - idle <= 1


def test_any_and_a_named_tool_constrain_the_engine_to_call() -> None:
    city = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}}}
    tools = [{"name": "weather", "input_schema": city}, TOOL]
    named = messages_request(req(tools=tools, tool_choice={"type": "tool", "name": "weather"})).constraint
    assert named is not None and named.kind == "json_schema"
    assert msgspec.json.decode(named.text) == city  # exactly the named tool's arguments
    anyone = messages_request(req(tools=tools, tool_choice={"type": "any"})).constraint
    assert anyone is not None and anyone.kind == "json_schema"
    assert {"weather", "f"} <= set(anyone.text.replace('"', " ").split())  # an array of calls to any tool
    for free in ({"type": "auto"}, {"type": "none"}):
        assert messages_request(req(tools=tools, tool_choice=free)).constraint is None
