"""/v1/conversations and its items through the official openai client, and responses that use them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import openai
import pytest
import pytest_asyncio

from node.http.tenancy import TENANT_HEADER
from tests.http.conftest import Cluster, start_cluster
from tests.http.test_responses import prompt_tokens

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster(llama3_model_dir: Path) -> AsyncIterator[Cluster]:
    async with start_cluster(llama3_model_dir, workers=1) as c:  # without --trust-tenant-header
        yield c


async def test_tenant_header_is_ignored_unless_trusted(cluster: Cluster) -> None:
    alice = cluster.client.with_options(default_headers={TENANT_HEADER: "alice"})
    conv = await alice.conversations.create()
    assert (await cluster.client.conversations.retrieve(conv.id)).id == conv.id


async def test_conversation_crud(cluster: Cluster) -> None:
    conversations = cluster.client.conversations
    conv = await conversations.create(metadata={"topic": "demo"})
    assert conv.id.startswith("conv_") and conv.object == "conversation" and conv.metadata == {"topic": "demo"}
    assert (await conversations.retrieve(conv.id)).model_dump() == conv.model_dump()
    updated = await conversations.update(conv.id, metadata={"topic": "changed", "user": "u1"})
    assert updated.metadata == {"topic": "changed", "user": "u1"}
    assert (await conversations.retrieve(conv.id)).metadata == updated.metadata
    deleted = await conversations.delete(conv.id)
    assert deleted.deleted and deleted.id == conv.id and deleted.object == "conversation.deleted"
    with pytest.raises(openai.NotFoundError):
        await conversations.retrieve(conv.id)
    with pytest.raises(openai.NotFoundError):
        await conversations.delete(conv.id)


async def test_items_add_list_retrieve_delete(cluster: Cluster) -> None:
    conversations = cluster.client.conversations
    conv = await conversations.create(
        items=[{"role": "user", "content": "first"}, {"role": "assistant", "content": "second"}]
    )
    added = await conversations.items.create(
        conv.id,
        items=[
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": f"more {i}"}]}
            for i in range(3)
        ],
    )
    assert [i.content[0].text for i in added.data] == ["more 0", "more 1", "more 2"]  # type: ignore[union-attr]
    assert added.first_id == added.data[0].id and added.last_id == added.data[-1].id and not added.has_more
    every = [i async for i in conversations.items.list(conv.id, limit=2, order="asc")]
    texts = [i.content[0].text for i in every]  # type: ignore[union-attr]
    assert texts == ["first", "second", "more 0", "more 1", "more 2"]
    assert every[1].role == "assistant" and every[1].content[0].type == "output_text"  # type: ignore[union-attr]
    newest = await conversations.items.list(conv.id, limit=2)
    assert [i.id for i in newest.data] == [every[4].id, every[3].id] and newest.has_more
    one = await conversations.items.retrieve(every[2].id, conversation_id=conv.id)
    assert one.id == every[2].id and one.type == "message"
    after = await conversations.items.delete(every[2].id, conversation_id=conv.id)
    assert after.id == conv.id and after.object == "conversation"
    with pytest.raises(openai.NotFoundError):
        await conversations.items.retrieve(every[2].id, conversation_id=conv.id)
    remaining = [i.id async for i in conversations.items.list(conv.id, order="asc")]
    assert remaining == [every[k].id for k in (0, 1, 3, 4)]


async def test_item_limits_are_400(cluster: Cluster) -> None:
    conv = await cluster.client.conversations.create()
    with pytest.raises(openai.BadRequestError) as err:
        await cluster.client.conversations.items.create(
            conv.id, items=[{"role": "user", "content": str(i)} for i in range(21)]
        )
    assert err.value.body["param"] == "items"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as err:
        await cluster.client.conversations.items.create(conv.id, items=[{"role": "nobody", "content": "x"}])
    assert err.value.body["param"] == "items[0].role"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError):
        await cluster.client.conversations.update(conv.id, metadata={str(i): "v" for i in range(17)})


async def test_responses_in_a_conversation_append_their_items(cluster: Cluster) -> None:
    client = cluster.client
    conv = await client.conversations.create(items=[{"role": "system", "content": "You are terse."}])
    r1 = await client.responses.create(model=cluster.model, input="Hi", conversation=conv.id, max_output_tokens=8)
    assert r1.conversation is not None and r1.conversation.id == conv.id
    r2 = await client.responses.create(
        model=cluster.model, input="Go on", conversation={"id": conv.id}, max_output_tokens=8, store=False
    )
    items = [i async for i in client.conversations.items.list(conv.id, order="asc")]
    assert [(i.role, i.content[0].text) for i in items] == [  # type: ignore[union-attr]
        ("system", "You are terse."),
        ("user", "Hi"),
        ("assistant", r1.output_text),
        ("user", "Go on"),
        ("assistant", r2.output_text),
    ]
    assert items[2].id == r1.output[0].id
    r3 = await client.responses.create(model=cluster.model, input="Last", conversation=conv.id, max_output_tokens=8)
    messages = [{"role": i.role, "content": i.content[0].text} for i in items]  # type: ignore[union-attr]
    assert r3.usage is not None
    assert r3.usage.input_tokens == prompt_tokens(cluster, [*messages, {"role": "user", "content": "Last"}])
    # store=false added its items to the conversation but is not itself retrievable.
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(r2.id)
