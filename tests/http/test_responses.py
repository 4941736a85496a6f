"""POST/GET/DELETE /v1/responses through the official openai client, against the memory history store."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
import pytest_asyncio

from node.http.tenancy import ApiConfig
from tests.http.conftest import Cluster, start_cluster

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster(llama3_model_dir: Path) -> AsyncIterator[Cluster]:
    async with start_cluster(llama3_model_dir, workers=1, api=ApiConfig(trust_tenant_header=True)) as c:
        yield c


def prompt_tokens(cluster: Cluster, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> int:
    """Tokens of `messages` rendered by the model's own chat template, as a chat completion would send them."""
    model = cluster.node.model
    assert model.template is not None
    text = model.template.render(messages, tools=tools, add_generation_prompt=True)
    return len(model.tokenizer.encode(text, add_special_tokens=False))


async def test_create_returns_a_response_object_and_stores_it(cluster: Cluster) -> None:
    r = await cluster.client.responses.create(
        model=cluster.model, input="Hello there", max_output_tokens=16, metadata={"k": "v"}
    )
    assert r.id.startswith("resp_") and r.object == "response"
    assert r.status == "incomplete" and r.incomplete_details is not None
    assert r.incomplete_details.reason == "max_output_tokens"
    assert r.model == cluster.model and r.store is True and r.metadata == {"k": "v"}
    (msg,) = r.output
    assert msg.type == "message" and msg.id.startswith("msg_") and msg.role == "assistant"
    assert r.output_text and "\ufffd" not in r.output_text
    assert r.usage is not None
    assert r.usage.output_tokens == 16
    assert r.usage.input_tokens == prompt_tokens(cluster, [{"role": "user", "content": "Hello there"}])
    assert r.usage.total_tokens == r.usage.input_tokens + 16
    assert r.usage.input_tokens_details.cached_tokens >= 0
    got = await cluster.client.responses.retrieve(r.id)
    assert got.model_dump() == r.model_dump()


async def test_answer_ends_with_completed_at_eos(cluster: Cluster) -> None:
    r = await cluster.client.responses.create(model=cluster.model, input="Say something", max_output_tokens=1000)
    assert r.status == "completed" and r.incomplete_details is None
    assert r.output[0].status == "completed"  # type: ignore[union-attr]


async def test_stream_sends_the_event_sequence_and_stores_before_the_last_event(cluster: Cluster) -> None:
    stream = await cluster.client.responses.create(model=cluster.model, input="Tell me a story", stream=True)
    events = []
    async for event in stream:
        events.append(event)
        if event.type == "response.completed":
            # Durable before acknowledged: retrievable the moment the terminal event arrives.
            stored = await cluster.client.responses.retrieve(event.response.id)
            assert stored.status == "completed"
    kinds = [e.type for e in events]
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) > 1  # the text streams in pieces (tokens that arrive together are one delta)
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * len(deltas),
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(d.delta for d in deltas)  # type: ignore[union-attr]
    final = events[-1].response  # type: ignore[union-attr]
    assert final.output_text == text == events[-4].text  # type: ignore[union-attr]
    assert events[0].response.status == "in_progress" and events[0].response.output == []  # type: ignore[union-attr]
    assert {d.item_id for d in deltas} == {final.output[0].id}  # type: ignore[union-attr]
    assert stored.model_dump() == final.model_dump()
    # Streamed and non-streamed answers to the same input are the same answer.
    plain = await cluster.client.responses.create(model=cluster.model, input="Tell me a story")
    assert plain.output_text == text
    assert plain.usage and final.usage
    assert (plain.usage.input_tokens, plain.usage.output_tokens) == (
        final.usage.input_tokens,
        final.usage.output_tokens,
    )


async def test_stream_helper_of_the_client_accumulates_the_answer(cluster: Cluster) -> None:
    async with cluster.client.responses.stream(model=cluster.model, input="Stream helper") as stream:
        async for _ in stream:
            pass
        final = await stream.get_final_response()
    assert final.status == "completed" and final.output_text
    assert (await cluster.client.responses.retrieve(final.id)).output_text == final.output_text


async def test_stream_ending_at_max_output_tokens_is_incomplete(cluster: Cluster) -> None:
    stream = await cluster.client.responses.create(
        model=cluster.model, input="Hi", stream=True, max_output_tokens=5, store=False
    )
    events = [e async for e in stream]
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.usage is not None and events[-1].response.usage.output_tokens == 5  # type: ignore[union-attr]


async def test_delete_removes_the_response(cluster: Cluster) -> None:
    r = await cluster.client.responses.create(model=cluster.model, input="to delete", max_output_tokens=4)
    await cluster.client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        await cluster.client.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        await cluster.client.responses.delete(r.id)


async def test_store_false_is_not_retrievable_nor_chainable(cluster: Cluster) -> None:
    r = await cluster.client.responses.create(model=cluster.model, input="ephemeral", max_output_tokens=4, store=False)
    assert r.store is False and r.output_text
    with pytest.raises(openai.NotFoundError):
        await cluster.client.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError) as err:
        await cluster.client.responses.create(model=cluster.model, input="next", previous_response_id=r.id)
    assert err.value.body["param"] == "previous_response_id"  # type: ignore[index]


async def test_input_items_paginate_in_both_orders(cluster: Cluster) -> None:
    texts = [f"message number {i}" for i in range(7)]
    r = await cluster.client.responses.create(
        model=cluster.model, input=[{"role": "user", "content": t} for t in texts], max_output_tokens=2
    )
    page = await cluster.client.responses.input_items.list(r.id, limit=3, order="asc")
    assert len(page.data) == 3 and page.has_more
    assert page.first_id == page.data[0].id and page.last_id == page.data[-1].id  # type: ignore[attr-defined]
    asc = [item async for item in cluster.client.responses.input_items.list(r.id, limit=3, order="asc")]
    assert [i.content[0].text for i in asc] == texts  # type: ignore[union-attr]
    desc = [item async for item in cluster.client.responses.input_items.list(r.id, limit=2)]
    assert [i.id for i in desc] == [i.id for i in reversed(asc)]
    assert all(i.type == "message" and i.role == "user" and i.id.startswith("msg_") for i in asc)  # type: ignore[union-attr]


async def test_previous_response_id_continues_the_chain(cluster: Cluster) -> None:
    client = cluster.client
    r1 = await client.responses.create(
        model=cluster.model, input="First question", instructions="Answer briefly.", max_output_tokens=12
    )
    r2 = await client.responses.create(
        model=cluster.model, input="Second question", previous_response_id=r1.id, max_output_tokens=12
    )
    r3 = await client.responses.create(
        model=cluster.model, input="Third question", previous_response_id=r2.id, max_output_tokens=12
    )
    assert r2.previous_response_id == r1.id and r3.previous_response_id == r2.id
    assert r1.usage and r2.usage and r3.usage
    assert r1.usage.input_tokens < r2.usage.input_tokens < r3.usage.input_tokens
    # The chain's items, in order, and not r1's instructions (OpenAI does not carry them over).
    history = [
        {"role": "user", "content": "First question"},
        {"role": "assistant", "content": r1.output_text},
        {"role": "user", "content": "Second question"},
        {"role": "assistant", "content": r2.output_text},
        {"role": "user", "content": "Third question"},
    ]
    assert r3.usage.input_tokens == prompt_tokens(cluster, history)
    assert r3.usage.input_tokens != prompt_tokens(cluster, [{"role": "system", "content": "Answer briefly."}, *history])
    # The simulated engine's answer is a function of the prompt ids: a chat completion over the same
    # messages gives the same text only if the rendered prompt is identical.
    chat = await client.chat.completions.create(model=cluster.model, messages=history, max_tokens=12)  # type: ignore[arg-type]
    assert chat.choices[0].message.content == r3.output_text
    assert r1.instructions == "Answer briefly." and r3.instructions is None


async def test_function_call_items_render_as_tool_calls(cluster: Cluster) -> None:
    tool = {
        "type": "function",
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
    r = await cluster.client.responses.create(
        model=cluster.model,
        tools=[tool],  # type: ignore[list-item]
        input=[
            {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "22 C and sunny"},
        ],
        max_output_tokens=8,
    )
    assert r.tools[0].name == "get_weather"  # type: ignore[union-attr]
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "22 C and sunny"},
    ]
    chat_tools = [{"type": "function", "function": {k: tool[k] for k in ("name", "description", "parameters")}}]
    assert r.usage is not None
    assert r.usage.input_tokens == prompt_tokens(cluster, messages, chat_tools)
    items = [i async for i in cluster.client.responses.input_items.list(r.id, order="asc")]
    assert [i.type for i in items] == ["message", "function_call", "function_call_output"]
