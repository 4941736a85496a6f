"""The Anthropic Messages API (issue 16) end to end with the official ``anthropic`` SDK: the engine's exact
tokens come from the in-memory worker (Qwen: <think> and Hermes <tool_call> JSON; Llama 3: bare JSON
calls), so these tests are about the gateway's adapter, parsers and Output stage."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anthropic
import pydantic
import pytest
import pytest_asyncio
from anthropic import AsyncAnthropic
from anthropic.types import Message, RawMessageStreamEvent
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from node.errors import GatewayError, NoHealthyWorker, WorkerFailed
from node.pipeline.pipeline import Pipeline
from node.pipeline.served_model import ServedModel, load_served_model
from tests.http.test_agentic import QWEN_CALL, QWEN_THOUGHT, Edge, qwen_answer, serve, thinking_model

WEATHER = {
    "name": "get_weather",
    "description": "Current weather of a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
ASK: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
THINK = {"type": "enabled", "budget_tokens": 1024}


@pytest.fixture(scope="module")
def qwen(qwen_model_dir: Path) -> ServedModel:
    return load_served_model(str(qwen_model_dir), served_name="qwen")


@pytest.fixture(scope="module")
def llama3(llama3_model_dir: Path) -> ServedModel:
    return load_served_model(str(llama3_model_dir), served_name="llama3")


@contextlib.asynccontextmanager
async def served(model: ServedModel, **worker: Any) -> AsyncIterator[tuple[Edge, AsyncAnthropic]]:
    async with serve(model, **worker) as edge:
        client = AsyncAnthropic(base_url=edge.url, api_key="k", max_retries=0, timeout=30)
        try:
            yield edge, client
        finally:
            await client.close()


@pytest_asyncio.fixture
async def q(qwen: ServedModel) -> AsyncIterator[tuple[Edge, AsyncAnthropic]]:
    async with served(qwen, chunk_tokens=3) as pair:
        yield pair


def summary(m: Message) -> list[Any]:
    """A message without its generated ids: what must not depend on chunking or streaming."""
    out: list[Any] = [m.stop_reason, m.stop_sequence, m.usage.output_tokens, m.usage.input_tokens]
    for b in m.content:
        if b.type == "tool_use":
            out.append(("tool_use", b.name, b.input, b.id.startswith("toolu_")))
        elif b.type == "thinking":
            out.append(("thinking", b.thinking, b.signature))
        elif b.type == "text":
            out.append(("text", b.text))
    return out


async def _raw_events(edge: Edge, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The SSE stream as (event name, data) pairs, exactly as sent."""
    async with edge.http.post(f"{edge.url}/v1/messages", json={**body, "stream": True}) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
        text = (await r.read()).decode()
    events = []
    for chunk in text.split("\n\n"):
        if not chunk:
            continue
        name_line, data_line = chunk.split("\n")
        assert name_line.startswith("event: ") and data_line.startswith("data: ")
        data = json.loads(data_line[6:])
        assert data["type"] == name_line[7:], "the event name is the data's type"
        events.append((name_line[7:], data))
    return events


async def test_thinking_text_answer_not_streamed_and_streamed(q: tuple[Edge, AsyncAnthropic]) -> None:
    edge, client = q
    edge.answer[0] = qwen_answer("Sunny, 21 degrees.")
    m = await client.messages.create(model="qwen", max_tokens=2048, messages=ASK, thinking=THINK)  # type: ignore[arg-type]
    assert m.id.startswith("msg_") and m.type == "message" and m.role == "assistant" and m.model == "qwen"
    assert [b.type for b in m.content] == ["thinking", "text"]
    thinking, text = m.content
    assert thinking.type == "thinking" and thinking.thinking.strip() == QWEN_THOUGHT and thinking.signature
    assert text.type == "text" and text.text == "Sunny, 21 degrees."
    assert m.stop_reason == "end_turn" and m.stop_sequence is None
    assert m.usage.input_tokens == len(edge.worker.requests[-1].prompt_ids)
    assert "<think>" not in edge.prompt()[-20:], "thinking on: the template leaves the model to think"

    async with client.messages.stream(model="qwen", max_tokens=2048, messages=ASK, thinking=THINK) as stream:  # type: ignore[arg-type]
        texts = [t async for t in stream.text_stream]
        final = await stream.get_final_message()
    assert "".join(texts) == "Sunny, 21 degrees."
    assert summary(final) == summary(m)


async def test_thinking_off_is_the_default(q: tuple[Edge, AsyncAnthropic]) -> None:
    edge, client = q
    edge.answer[0] = "Hello there."
    m = await client.messages.create(model="qwen", max_tokens=64, messages=ASK)
    assert summary(m)[4:] == [("text", "Hello there.")]
    assert edge.prompt().endswith("<think>\n\n</think>\n\n"), "thinking off: the template's empty block"
    await client.messages.create(model="qwen", max_tokens=64, messages=ASK, thinking={"type": "disabled"})
    assert edge.prompt().endswith("<think>\n\n</think>\n\n")
    await client.messages.create(model="qwen", max_tokens=64, messages=ASK, thinking={"type": "adaptive"})  # type: ignore[arg-type,typeddict-item]
    assert not edge.prompt().endswith("</think>\n\n"), "adaptive: the model's own default (Qwen3 thinks)"


async def test_tool_use_round_trip(q: tuple[Edge, AsyncAnthropic]) -> None:
    edge, client = q
    edge.answer[0] = qwen_answer("I'll check. " + QWEN_CALL)
    m = await client.messages.create(
        model="qwen",
        max_tokens=2048,
        system=[{"type": "text", "text": "You are terse."}],
        messages=ASK,
        tools=[WEATHER],  # type: ignore[list-item]
        thinking=THINK,  # type: ignore[arg-type]
    )
    assert "get_weather" in edge.prompt() and "You are terse." in edge.prompt(), "tools and system rendered"
    assert [b.type for b in m.content] == ["thinking", "text", "tool_use"]
    call = m.content[2]
    assert call.type == "tool_use" and call.name == "get_weather" and call.input == {"city": "Paris"}
    assert call.id.startswith("toolu_") and m.stop_reason == "tool_use"

    edge.answer[0] = qwen_answer("It is sunny in Paris.")
    history: list[Any] = [
        *ASK,
        {"role": "assistant", "content": [b.model_dump() for b in m.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call.id, "content": [{"type": "text", "text": "21C"}]}],
        },
    ]
    answer = await client.messages.create(
        model="qwen",
        max_tokens=2048,
        messages=history,
        tools=[WEATHER],  # type: ignore[list-item]
        thinking=THINK,  # type: ignore[arg-type]
    )
    prompt = edge.prompt()
    assert "<tool_response>\n21C\n</tool_response>" in prompt, "the result rendered as the template's tool turn"
    assert '"city": "Paris"' in prompt, "the call passed back rendered with its input"
    assert QWEN_THOUGHT in prompt, "the thinking passed back reaches the template (the turn after the user)"
    assert answer.stop_reason == "end_turn" and answer.content[-1].type == "text"
    assert answer.content[-1].text == "It is sunny in Paris."

    edge.answer[0] = "Sorry, that failed."
    history[-1]["content"][0] |= {"is_error": True, "content": "timeout"}
    await client.messages.create(model="qwen", max_tokens=64, messages=history, tools=[WEATHER])  # type: ignore[list-item]
    assert "Error: timeout" in edge.prompt()


async def test_streaming_event_order_and_block_indexes(q: tuple[Edge, AsyncAnthropic]) -> None:
    edge, _ = q
    edge.answer[0] = qwen_answer("I'll check. " + QWEN_CALL)
    events = await _raw_events(
        edge, {"model": "qwen", "max_tokens": 2048, "messages": ASK, "tools": [WEATHER], "thinking": THINK}
    )
    # The SDK builds its objects without validating: validate the wire JSON against its types here.
    adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(RawMessageStreamEvent)
    for name, data in events:
        if name != "ping":
            adapter.validate_python(data)
    async with edge.http.post(
        f"{edge.url}/v1/messages",
        json={"model": "qwen", "max_tokens": 2048, "messages": ASK, "tools": [WEATHER], "thinking": THINK},
    ) as r:
        Message.model_validate(await r.json())
    names = [n for n, _ in events]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]
    start = events[0][1]["message"]
    assert start["id"].startswith("msg_") and start["content"] == [] and start["usage"]["output_tokens"] == 0
    # Per block: start, deltas, stop; indexes 0, 1, 2 in order; never two blocks open.
    opened: list[int] = []
    kinds: dict[int, set[str]] = {}
    current = None
    for name, data in events[2:-2]:
        if name == "content_block_start":
            assert current is None
            current = data["index"]
            opened.append(current)
        elif name == "content_block_delta":
            assert data["index"] == current
            kinds.setdefault(current, set()).add(data["delta"]["type"])
        elif name == "content_block_stop":
            assert data["index"] == current
            current = None
    assert opened == [0, 1, 2] and current is None
    assert kinds == {0: {"thinking_delta", "signature_delta"}, 1: {"text_delta"}, 2: {"input_json_delta"}}
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] > 0


async def test_stop_sequences_and_max_tokens(q: tuple[Edge, AsyncAnthropic]) -> None:
    edge, client = q
    edge.answer[0] = "one two three four five six seven"
    m = await client.messages.create(model="qwen", max_tokens=64, messages=ASK, stop_sequences=["four", "zzz"])
    assert (m.stop_reason, m.stop_sequence) == ("stop_sequence", "four")
    assert m.content[0].type == "text" and m.content[0].text == "one two three "
    async with client.messages.stream(model="qwen", max_tokens=64, messages=ASK, stop_sequences=["four"]) as s:
        final = await s.get_final_message()
    assert summary(final) == summary(m)

    m = await client.messages.create(model="qwen", max_tokens=3, messages=ASK)
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 3


async def test_thinking_budget_closes_the_block_and_the_model_answers(q: tuple[Edge, AsyncAnthropic]) -> None:
    edge, client = q
    tok = edge.model.tokenizer
    close = edge.model.parsers.think_close_ids
    assert tok.decode(close, skip_special_tokens=False) == "</think>\n\n", "Qwen3's close, from its family"
    edge.worker.reply = thinking_model(edge, "Sunny.", thought=" ".join(["thought"] * 1500))
    m = await client.messages.create(model="qwen", max_tokens=4000, messages=ASK, thinking=THINK)  # type: ignore[arg-type]
    first, cont = edge.worker.requests[-2:]
    assert [b.type for b in m.content] == ["thinking", "text"] and m.stop_reason == "end_turn"
    thinking, text = m.content
    assert thinking.type == "thinking" and thinking.signature and text.type == "text" and text.text == "Sunny."
    # The block holds exactly the budget: the first 1024 reasoning tokens the model wrote, then it was closed.
    reasoning = tok.encode(thinking.thinking, add_special_tokens=False)
    assert len(reasoning) == 1024 and thinking.thinking.split() == ["thought"] * 1023  # and its first "\\n"
    # The continuation: the prompt, what the model wrote (<think> and 1024 tokens), the close; the rest of
    # max_tokens; its own request id (the first stream, cut at the budget, was aborted under its own).
    written = list(cont.prompt_ids[len(first.prompt_ids) : -len(close)])
    assert list(cont.prompt_ids) == [*first.prompt_ids, *written, *close] and len(written) == 1 + 1024
    assert tok.decode(written[:1], skip_special_tokens=False) == "<think>"
    assert cont.params.max_tokens == 4000 - len(written) - len(close)
    assert first.request_id in edge.worker.aborted and cont.request_id != first.request_id
    # Usage counts each output token once: <think>, the budget, the close, the answer and its end token.
    answer_ids = tok.encode("Sunny.", add_special_tokens=False)
    assert m.usage.output_tokens == 1 + 1024 + len(close) + len(answer_ids) + 1
    assert m.usage.input_tokens == len(first.prompt_ids), "the continuation's prompt is not the client's input"

    async with client.messages.stream(model="qwen", max_tokens=4000, messages=ASK, thinking=THINK) as stream:  # type: ignore[arg-type]
        texts = [t async for t in stream.text_stream]
        final = await stream.get_final_message()
    assert "".join(texts) == "Sunny." and summary(final) == summary(m)


async def test_a_budget_larger_than_the_reasoning_changes_nothing(q: tuple[Edge, AsyncAnthropic]) -> None:
    edge, client = q
    edge.worker.reply = thinking_model(edge, "Sunny.", thought=" ".join(["thought"] * 1000))
    m = await client.messages.create(model="qwen", max_tokens=4000, messages=ASK, thinking=THINK)  # type: ignore[arg-type]
    assert len(edge.worker.requests) == 1, "one generation, finished by the model"
    assert m.stop_reason == "end_turn" and [b.type for b in m.content] == ["thinking", "text"]
    thinking, text = m.content
    assert thinking.type == "thinking" and thinking.thinking.strip() == " ".join(["thought"] * 1000)
    assert text.type == "text" and text.text == "Sunny."
    written = edge.model.tokenizer.encode(qwen_answer("Sunny.", " ".join(["thought"] * 1000)), add_special_tokens=False)
    assert m.usage.output_tokens == len(written) + 1


async def test_max_tokens_reached_in_the_continuation(q: tuple[Edge, AsyncAnthropic]) -> None:
    edge, client = q
    edge.worker.reply = thinking_model(edge, "Sunny in Paris today.", thought=" ".join(["thought"] * 1500))
    close = edge.model.parsers.think_close_ids
    limit = 1 + 1024 + len(close) + 2  # two tokens of answer
    for stream in (False, True):
        if stream:
            async with client.messages.stream(model="qwen", max_tokens=limit, messages=ASK, thinking=THINK) as s:  # type: ignore[arg-type]
                m = await s.get_final_message()
        else:
            m = await client.messages.create(model="qwen", max_tokens=limit, messages=ASK, thinking=THINK)  # type: ignore[arg-type]
        assert m.stop_reason == "max_tokens" and m.usage.output_tokens == limit
        assert [b.type for b in m.content] == ["thinking", "text"]
        assert edge.worker.requests[-1].params.max_tokens == 2
        text = m.content[1]
        assert text.type == "text" and "Sunny in Paris today.".startswith(text.text) and text.text


async def test_no_room_after_the_budget_ends_as_before(q: tuple[Edge, AsyncAnthropic]) -> None:
    """max_tokens leaves no token for an answer after <think>, the budget and the close: the choice ends at
    the budget, stop_reason max_tokens, nothing continued."""
    edge, client = q
    edge.worker.reply = thinking_model(edge, "Sunny.", thought=" ".join(["thought"] * 1500))
    m = await client.messages.create(model="qwen", max_tokens=1027, messages=ASK, thinking=THINK)  # type: ignore[arg-type]
    assert m.stop_reason == "max_tokens" and [b.type for b in m.content] == ["thinking"]
    assert m.usage.output_tokens == 1 + 1024 and len(edge.worker.requests) == 1


async def test_count_tokens_equals_the_prompt_the_engine_saw(q: tuple[Edge, AsyncAnthropic]) -> None:
    edge, client = q
    kw: dict[str, Any] = {"model": "qwen", "messages": ASK, "tools": [WEATHER], "system": "Be brief."}
    counted = await client.messages.count_tokens(**kw)
    await client.messages.create(max_tokens=16, **kw)
    assert counted.input_tokens == len(edge.worker.requests[-1].prompt_ids)


async def test_cached_prompt_tokens_are_cache_reads(qwen: ServedModel) -> None:
    async with served(qwen, cached_tokens=5) as (_, client):
        m = await client.messages.create(model="qwen", max_tokens=8, messages=ASK)
        n = (await client.messages.count_tokens(model="qwen", messages=ASK)).input_tokens
    assert m.usage.cache_read_input_tokens == 5 and m.usage.input_tokens == n - 5


async def test_llama3_tool_use(llama3: ServedModel) -> None:
    async with served(llama3, chunk_tokens=2) as (edge, client):
        edge.answer[0] = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
        m = await client.messages.create(model="llama3", max_tokens=128, messages=ASK, tools=[WEATHER])  # type: ignore[list-item]
        assert [(b.type, getattr(b, "input", None)) for b in m.content] == [("tool_use", {"city": "Paris"})]
        assert m.stop_reason == "tool_use"
        async with client.messages.stream(model="llama3", max_tokens=128, messages=ASK, tools=[WEATHER]) as s:  # type: ignore[list-item]
            final = await s.get_final_message()
        assert summary(final) == summary(m)
        edge.answer[0] = "Plain answer."
        m = await client.messages.create(model="llama3", max_tokens=2048, messages=ASK, thinking=THINK)  # type: ignore[arg-type]
        assert summary(m)[4:] == [("text", "Plain answer.")], "a model without reasoning answers without thinking"


# --- errors -----------------------------------------------------------------------------------------------


async def test_errors_in_anthropics_envelope(q: tuple[Edge, AsyncAnthropic]) -> None:
    edge, client = q
    with pytest.raises(anthropic.BadRequestError) as bad:
        await client.messages.create(model="qwen", max_tokens=0, messages=ASK)
    assert bad.value.body == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": bad.value.body["error"]["message"]},  # type: ignore[index]
        "request_id": bad.value.body["request_id"],  # type: ignore[index]
    }
    assert bad.value.body["request_id"], "Anthropic's envelope names the request at the top"  # type: ignore[index]
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
    with pytest.raises(anthropic.BadRequestError, match="does not take image"):
        await client.messages.create(model="qwen", max_tokens=8, messages=[{"role": "user", "content": [image]}])  # type: ignore[list-item]
    with pytest.raises(anthropic.BadRequestError, match="budget_tokens"):
        await client.messages.create(
            model="qwen", max_tokens=8, messages=ASK, thinking={"type": "enabled", "budget_tokens": 10}
        )
    async with edge.http.post(f"{edge.url}/v1/messages", json={"model": "qwen", "messages": ASK}) as r:
        assert r.status == 400 and "max_tokens" in (await r.json())["error"]["message"], "max_tokens is required"
    with pytest.raises(anthropic.BadRequestError, match="not-a-feature"):
        await client.messages.create(
            model="qwen", max_tokens=8, messages=ASK, extra_headers={"anthropic-beta": "not-a-feature"}
        )
    await client.messages.create(  # known betas, any version, either auth header: accepted
        model="qwen",
        max_tokens=8,
        messages=ASK,
        extra_headers={"anthropic-beta": "token-counting-2024-11-01", "Authorization": "Bearer x"},
    )
    with pytest.raises(anthropic.BadRequestError, match="max_output_tokens_total"):
        await client.messages.create(model="qwen", max_tokens=10**9, messages=ASK)
    with pytest.raises(anthropic.NotFoundError) as missing:
        await client.messages.create(model="nope", max_tokens=8, messages=ASK)
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]


@pytest.mark.parametrize(
    ("failure", "status", "kind"),
    [
        (NoHealthyWorker("no worker"), 529, "overloaded_error"),
        (WorkerFailed("broke"), 500, "api_error"),
    ],
)
async def test_worker_failures_map_to_anthropic_statuses(
    qwen: ServedModel, failure: Exception, status: int, kind: str
) -> None:
    async with served(qwen, failure=failure) as (_, client):
        with pytest.raises(anthropic.APIStatusError) as err:
            await client.messages.create(model="qwen", max_tokens=8, messages=ASK)
    assert err.value.status_code == status and err.value.body["error"]["type"] == kind  # type: ignore[index]


class _Refused(GatewayError):
    pass


@pytest.mark.parametrize(
    ("status", "sdk_error", "kind"),
    [
        (401, anthropic.AuthenticationError, "authentication_error"),
        (403, anthropic.PermissionDeniedError, "permission_error"),
        (429, anthropic.RateLimitError, "rate_limit_error"),
        (504, anthropic.APIStatusError, "timeout_error"),
    ],
)
async def test_refusals_of_other_layers_reach_the_sdk_as_anthropic_errors(
    q: tuple[Edge, AsyncAnthropic], monkeypatch: pytest.MonkeyPatch, status: int, sdk_error: type, kind: str
) -> None:
    """A refusal raised anywhere behind the error middleware (auth, rate limits, deadlines) leaves in
    Anthropic's envelope with its status, so the SDK raises its own exception class."""
    _, client = q
    refusal = type("Refusal", (_Refused,), {"status": status})

    def refuse(self: Pipeline, requested: str) -> ServedModel:
        raise refusal("refused")

    monkeypatch.setattr(Pipeline, "model", refuse)
    with pytest.raises(sdk_error) as err:
        await client.messages.create(model="qwen", max_tokens=8, messages=ASK)
    assert err.value.status_code == status  # type: ignore[attr-defined]
    body = dict(err.value.body)  # type: ignore[attr-defined]
    assert body.pop("request_id") and body == {"type": "error", "error": {"type": kind, "message": "refused"}}


async def test_a_body_over_the_limit_is_request_too_large(q: tuple[Edge, AsyncAnthropic]) -> None:
    _, client = q
    with pytest.raises(anthropic.APIStatusError) as err:
        await client.messages.create(
            model="qwen", max_tokens=8, messages=[{"role": "user", "content": "x" * (2 << 20)}]
        )
    assert err.value.status_code == 413 and err.value.body["error"]["type"] == "request_too_large"  # type: ignore[index]


async def test_other_statuses_map_to_their_anthropic_types() -> None:
    from node.http.anthropic_messages import anthropic_status, error_object

    for status, kind in [(401, "authentication_error"), (403, "permission_error"), (429, "rate_limit_error")]:
        assert anthropic_status(status) == status and error_object(status, "m")["error"]["type"] == kind
    assert error_object(413, "m")["error"]["type"] == "request_too_large"
    assert error_object(504, "m")["error"]["type"] == "timeout_error"


async def test_a_worker_failing_mid_stream_sends_an_error_event(qwen: ServedModel) -> None:
    async with served(qwen, fail_after=3) as (edge, _):
        edge.answer[0] = "one two three four five six seven eight"
        events = await _raw_events(edge, {"model": "qwen", "max_tokens": 64, "messages": ASK})
    assert events[0][0] == "message_start" and events[-1][0] == "error"
    assert events[-1][1] == {
        "type": "error",
        "error": {"type": "api_error", "message": events[-1][1]["error"]["message"]},
    }


# --- property: chunking --------------------------------------------------------------------------------------


def test_any_chunking_gives_the_non_streamed_message(qwen: ServedModel) -> None:
    """Whatever ids per message the engine sends, the streamed message (accumulated by the SDK) equals the
    non-streamed one: blocks, their text, calls, stop reason, usage."""
    kw: dict[str, Any] = {"model": "qwen", "max_tokens": 2048, "messages": ASK, "tools": [WEATHER], "thinking": THINK}
    with asyncio.Runner() as runner:
        stack = contextlib.AsyncExitStack()
        edge, client = runner.run(stack.enter_async_context(served(qwen)))
        try:
            edge.answer[0] = qwen_answer("Checking… " + QWEN_CALL + "\n" + QWEN_CALL)
            reference = summary(runner.run(client.messages.create(**kw)))
            assert [r[0] for r in reference[4:]] == ["thinking", "text", "tool_use", "tool_use"]

            async def streamed() -> Message:
                async with client.messages.stream(**kw) as s:
                    return await s.get_final_message()

            @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
            @given(st.lists(st.integers(1, 9), min_size=1, max_size=8), st.booleans())
            def check(sizes: list[int], stream: bool) -> None:
                edge.worker.chunk_sizes = tuple(sizes)
                got = runner.run(streamed() if stream else client.messages.create(**kw))
                assert summary(got) == reference

            check()
        finally:
            runner.run(stack.aclose())
