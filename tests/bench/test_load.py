"""The load generator's minimal SSE parsing, without sockets."""

from __future__ import annotations

import json

import pytest

from bench.load import LoadError, final_usage, has_content, request_body

ROLE = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
TOKEN = b'data: {"choices":[{"index":0,"delta":{"content":" Sign"}}],"usage":null}\n\n'
USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":11,"completion_tokens":5,"total_tokens":16}}\n\n'
DONE = b"data: [DONE]\n\n"


def test_request_body_asks_for_exact_length_and_usage() -> None:
    body = json.loads(request_body("llama3", "Request 7. Hello.", 20))
    assert body["max_tokens"] == 20
    assert body["ignore_eos"] is True
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["messages"] == [{"role": "user", "content": "Request 7. Hello."}]


def test_first_content_is_the_first_non_empty_delta() -> None:
    assert not has_content(ROLE)
    assert has_content(ROLE + TOKEN)


def test_a_thinking_model_s_first_token_is_its_first_reasoning_delta() -> None:
    reasoning = b'data: {"choices":[{"index":0,"delta":{"reasoning_content":" Let"}}]}\n\n'
    assert has_content(ROLE + reasoning)
    assert not has_content(ROLE + b'data: {"choices":[{"index":0,"delta":{"reasoning_content":""}}]}\n\n')


def test_a_partial_event_is_not_read_yet() -> None:
    assert not has_content(ROLE + TOKEN[:-1])
    assert not has_content(ROLE + TOKEN[:20])


def test_an_error_event_fails_the_request() -> None:
    with pytest.raises(LoadError, match="error event"):
        has_content(b'data: {"error":{"message":"boom"}}\n\n')


def test_usage_is_read_from_the_tail() -> None:
    usage = final_usage(TOKEN + TOKEN + USAGE + DONE)
    assert (usage.prompt_tokens, usage.completion_tokens) == (11, 5)


@pytest.mark.parametrize(
    ("tail", "message"),
    [(TOKEN + USAGE, "did not end with"), (TOKEN + DONE, "no usage chunk"), (USAGE[8:] + DONE, "cut off")],
)
def test_a_stream_without_usage_or_done_is_an_error(tail: bytes, message: str) -> None:
    with pytest.raises(LoadError, match=message):
        final_usage(tail)
