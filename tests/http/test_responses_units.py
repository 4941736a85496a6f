"""The pure pieces behind /v1/responses: item normalization and rendering, event framing, the outage gate."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from node.errors import InvalidRequest
from node.http.history import OutageGate
from node.http.responses_output import ResponseOutput
from node.http.responses_stream import ResponseEvents
from node.pipeline.events import ContentDelta, ToolCallDelta
from node.pipeline.responses_items import chat_messages, chat_tools, normalize_input, normalize_tools, output_message


def ids() -> Any:
    counter = itertools.count()
    return lambda prefix: f"{prefix}_{next(counter)}"


def test_string_input_is_one_user_message() -> None:
    assert normalize_input("hi", ids()) == [
        {
            "id": "msg_0",
            "type": "message",
            "role": "user",
            "status": "completed",
            "content": [{"type": "input_text", "text": "hi"}],
        }
    ]


def test_items_keep_given_ids_and_get_canonical_content() -> None:
    items = normalize_input(
        [
            {"role": "assistant", "content": "earlier", "id": "msg_keep"},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "42"}]},
        ],
        ids(),
    )
    assert items[0]["id"] == "msg_keep"
    assert items[0]["content"] == [{"type": "output_text", "text": "earlier", "annotations": []}]
    assert items[1]["id"] == "fc_0" and items[2]["id"] == "fco_1" and items[2]["output"] == "42"


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        ([{"role": "user", "content": [{"type": "input_audio"}]}], "input[0].content[0].type"),
        ([{"role": "user", "content": [{"type": "input_text"}]}], "input[0].content[0].text"),
        ([{"role": "user", "content": "x", "id": ""}], "input[0].id"),
        ([{"type": "function_call", "call_id": "c", "name": 3, "arguments": "{}"}], "input[0].name"),
        ([{"type": "function_call_output", "call_id": "c", "output": 3}], "input[0].output"),
    ],
)
def test_bad_items_name_the_field(raw: list[Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        normalize_input(raw, ids())
    assert err.value.param == param


def test_chat_messages_group_calls_into_the_assistant_turn() -> None:
    items = normalize_input(
        [
            {"role": "developer", "content": "rules"},
            {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
            {"role": "assistant", "content": "let me look"},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"x": 1}'},
            {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "not json"},
            {"type": "function_call_output", "call_id": "c1", "output": "one"},
        ],
        ids(),
    )
    messages = chat_messages(items, instructions="be nice")
    assert messages[:3] == [
        {"role": "system", "content": "be nice"},
        {"role": "system", "content": "rules"},
        {"role": "user", "content": "a\nb"},
    ]
    assistant = messages[3]
    assert assistant["content"] == "let me look"
    assert [c["function"]["arguments"] for c in assistant["tool_calls"]] == [{"x": 1}, "not json"]
    assert messages[4] == {"role": "tool", "tool_call_id": "c1", "content": "one"}
    assert chat_messages([], instructions=None) == []


def test_tools_convert_to_the_chat_shape() -> None:
    tools = normalize_tools([{"type": "function", "name": "f", "parameters": {"type": "object"}}])
    assert tools[0]["strict"] is True and tools[0]["description"] is None
    assert chat_tools(tools) == [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert chat_tools([]) is None
    with pytest.raises(InvalidRequest) as err:
        normalize_tools([{"type": "function", "name": "f", "parameters": "nope"}])
    assert err.value.param == "tools[0].parameters"


def _parse(frames: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in frames.decode().split("\n\n")[:-1]:
        event_line, data_line = block.split("\n")
        out.append((event_line.removeprefix("event: "), json.loads(data_line.removeprefix("data: "))))
    return out


def test_events_are_numbered_and_typed() -> None:
    events = ResponseEvents()
    output = ResponseOutput(lambda prefix: f"{prefix}_1", events)
    frames = events.response("response.created", {"id": "resp_1"})
    frames += output.feed(ContentDelta(0, "a")) + output.feed(ContentDelta(0, '"b\n')) + output.finish("stop")
    parsed = _parse(frames)
    assert [name for name, _ in parsed] == [data["type"] for _, data in parsed]
    assert [data["sequence_number"] for _, data in parsed] == list(range(8)) and events.sent == 8
    assert parsed[4][1] == {
        "type": "response.output_text.delta",
        "item_id": "msg_1",
        "output_index": 0,
        "content_index": 0,
        "logprobs": [],
        "sequence_number": 4,
        "delta": '"b\n',
    }
    assert parsed[6][1]["part"] == {"type": "output_text", "text": 'a"b\n', "annotations": [], "logprobs": []}
    assert output.items == [output_message("msg_1", 'a"b\n')]


def test_function_call_arguments_stream_per_fragment() -> None:
    events = ResponseEvents()
    output = ResponseOutput(lambda prefix: f"{prefix}_1", events)
    frames = output.feed(ToolCallDelta(0, 0, id="call_a", name="f"))
    frames += output.feed(ToolCallDelta(0, 0, arguments='{"a": ')) + output.feed(ToolCallDelta(0, 0, arguments="1}"))
    parsed = _parse(frames + output.finish("stop"))
    assert [name for name, _ in parsed] == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]
    assert parsed[0][1]["item"]["arguments"] == "" and parsed[0][1]["item"]["name"] == "f"
    assert [data["delta"] for _, data in parsed[1:3]] == ['{"a": ', "1}"]
    assert parsed[3][1]["arguments"] == '{"a": 1}' and parsed[4][1]["item"]["status"] == "completed"
    cut = ResponseOutput(lambda prefix: f"{prefix}_1", ResponseEvents())
    cut.feed(ToolCallDelta(0, 0, id="call_a", name="f"))
    cut.feed(ToolCallDelta(0, 0, arguments='{"a": '))
    cut.finish("length")
    assert cut.items[0]["status"] == "incomplete" and cut.items[0]["arguments"] == '{"a": '


def test_outage_gate_holds_then_lets_a_probe_through() -> None:
    now = [100.0]
    gate = OutageGate(hold_s=1.0, clock=lambda: now[0])
    assert not gate.is_open()
    gate.failed()
    assert gate.is_open()
    now[0] += 0.99
    assert gate.is_open()
    now[0] += 0.02
    assert not gate.is_open()
    gate.failed()
    gate.succeeded()
    assert not gate.is_open()
