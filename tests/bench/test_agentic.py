"""The agentic workload's pure parts: reading a streamed answer back together and judging it."""

from __future__ import annotations

import json

import msgspec

from bench.agentic import (
    TOOLS,
    Answer,
    Outcome,
    ToolCall,
    call_errors,
    chat_body,
    classify,
    first_turn,
    note_tool,
    second_turn,
    sse_payloads,
)


def chunk(**delta: object) -> bytes:
    return json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": None}]}).encode()


def streamed_call(name: str, arguments: str, pieces: int = 3) -> Answer:
    """A call streamed as OpenAI does: id and name first, then the arguments in fragments."""
    answer = Answer()
    answer.feed(chunk(tool_calls=[{"index": 0, "id": "call_1", "type": "function", "function": {"name": name}}]))
    step = max(1, len(arguments) // pieces)
    for at in range(0, len(arguments), step):
        answer.feed(chunk(tool_calls=[{"index": 0, "function": {"arguments": arguments[at : at + step]}}]))
    answer.feed(json.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}).encode())
    answer.feed(b"[DONE]")
    return answer


def test_sse_payloads_keep_a_partial_event_for_later() -> None:
    buffer = bytearray(b'data: {"a":1}\n\ndata: [DONE]\n\ndata: {"b"')
    assert sse_payloads(buffer) == [b'{"a":1}', b"[DONE]"]
    assert bytes(buffer) == b'data: {"b"'
    buffer += b":2}\n\n"
    assert sse_payloads(buffer) == [b'{"b":2}']


def test_a_streamed_call_that_matches_its_schema_is_correct() -> None:
    answer = streamed_call("get_weather", '{"city": "Paris", "days": 3, "unit": "celsius"}')
    assert answer.done and answer.finish_reason == "tool_calls"
    assert classify(answer, TOOLS) == (Outcome.CALL_OK, [])
    assert answer.ordered_calls()[0].id == "call_1"


def test_calls_that_break_the_schema_are_bad_and_say_why() -> None:
    cases = {
        '{"city": "Paris", "days": 9}': "outside [1, 7]",
        '{"city": "Paris"}': "missing 'days'",
        '{"city": "Paris", "days": 2, "unit": "kelvin"}': "not in",
        '{"city": "Paris", "days": 2, "wind": true}': "unexpected 'wind'",
        '{"city": "Paris", "days": true}': "not an integer",
        '{"city": "Paris", "days": 2': "not JSON",
    }
    for arguments, reason in cases.items():
        outcome, why = classify(streamed_call("get_weather", arguments), TOOLS)
        assert outcome is Outcome.CALL_BAD, arguments
        assert reason in why[0], (arguments, why)
    assert call_errors(ToolCall(0, "c", "delete_all", "{}"), TOOLS) == ["unknown function 'delete_all'"]


def test_markup_left_in_the_content_is_a_missed_call_not_text() -> None:
    leaked = Answer(content='<tool_call>\n{"name": "get_weather", "arguments": {"city": "x", "days": 1}}\n</tool_call>')
    assert classify(leaked, TOOLS)[0] is Outcome.MARKUP_IN_TEXT
    assert classify(Answer(content='{"name": "get_weather", "parameters": {}}'), TOOLS)[0] is Outcome.MARKUP_IN_TEXT
    assert classify(Answer(content="Sunny all week."), TOOLS)[0] is Outcome.TEXT
    assert classify(Answer(reasoning="hmm"), TOOLS)[0] is Outcome.EMPTY


def test_reasoning_content_and_usage_are_read() -> None:
    answer = Answer()
    assert answer.feed(chunk(reasoning_content="think"))
    assert answer.feed(chunk(content="Sunny."))
    assert not answer.feed(json.dumps({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4}}).encode())
    assert (answer.reasoning, answer.content, answer.prompt_tokens, answer.completion_tokens) == (
        "think",
        "Sunny.",
        9,
        4,
    )


def test_the_second_turn_returns_every_call_with_its_result() -> None:
    answer = Answer()
    for index, city in enumerate(("Paris", "Oslo")):
        answer.calls[index] = ToolCall(index, f"call_{index}", "get_weather", json.dumps({"city": city, "days": 1}))
    messages = second_turn(first_turn(7), answer)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "tool"]
    assert [c["id"] for c in messages[2]["tool_calls"]] == ["call_0", "call_1"]
    assert [m["tool_call_id"] for m in messages[3:]] == ["call_0", "call_1"]
    body = msgspec.json.decode(chat_body("m", messages, TOOLS, seed=7, max_tokens=64, thinking=False))
    assert body["tool_choice"] == "auto" and body["seed"] == 7 and body["stream"] is True
    assert body["chat_template_kwargs"] == {"enable_thinking": False}


def test_the_note_tool_fixes_the_argument_length() -> None:
    tools = [note_tool(12)]
    assert classify(streamed_call("write_note", json.dumps({"text": "x" * 12})), tools)[0] is Outcome.CALL_OK
    assert classify(streamed_call("write_note", json.dumps({"text": "x" * 11})), tools)[0] is Outcome.CALL_BAD
