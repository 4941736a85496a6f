"""Smoke: the Responses and Conversations APIs on a node whose history lives in real Redis / Postgres.

Each run uses its own key/table prefix and removes it afterwards.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import openai
import pytest

from node.http.tenancy import TENANT_HEADER, ApiConfig
from storage.config import StorageConfig
from tests.http.conftest import start_cluster
from tests.storage.conftest import PG_PORT, PG_URL, REDIS_PORT, REDIS_URL, delete_keys, drop_tables, port_open


@pytest.mark.parametrize("backend", ["redis", "postgres"])
async def test_responses_and_conversations_on_a_shared_backend(llama3_model_dir: Path, backend: str) -> None:
    if not port_open(REDIS_PORT if backend == "redis" else PG_PORT):
        pytest.skip(f"{backend} is not running on 127.0.0.1")
    prefix = f"t{uuid.uuid4().hex[:10]}"
    storage = (
        StorageConfig(backend="redis", redis_url=REDIS_URL, key_prefix=prefix)
        if backend == "redis"
        else StorageConfig(backend="postgres", postgres_url=PG_URL, table_prefix=prefix + "_")
    )
    try:
        async with start_cluster(
            llama3_model_dir, workers=1, storage=storage, api=ApiConfig(trust_tenant_header=True)
        ) as c:
            client = c.client.with_options(default_headers={TENANT_HEADER: "smoke"})
            stream = await client.responses.create(model=c.model, input="One", stream=True, max_output_tokens=6)
            async for event in stream:
                if event.type in ("response.completed", "response.incomplete"):
                    first = await client.responses.retrieve(event.response.id)  # durable at the final event
            second = await client.responses.create(
                model=c.model, input="Two", previous_response_id=first.id, max_output_tokens=6
            )
            assert second.usage and first.usage and second.usage.input_tokens > first.usage.input_tokens
            items = [i async for i in client.responses.input_items.list(second.id, order="asc")]
            assert [i.content[0].text for i in items] == ["Two"]  # type: ignore[union-attr]
            with pytest.raises(openai.NotFoundError):
                await c.client.responses.retrieve(second.id)  # another tenant
            conv = await client.conversations.create(items=[{"role": "user", "content": "Hello"}])
            await client.responses.create(model=c.model, input="Again", conversation=conv.id, max_output_tokens=4)
            listed = [i async for i in client.conversations.items.list(conv.id, order="asc")]
            assert [i.role for i in listed] == ["user", "user", "assistant"]  # type: ignore[union-attr]
            await client.responses.delete(second.id)
            await client.conversations.delete(conv.id)
            with pytest.raises(openai.NotFoundError):
                await client.responses.retrieve(second.id)
    finally:
        if backend == "redis":
            await delete_keys(REDIS_URL, prefix)
        else:
            await drop_tables(PG_URL, prefix + "_")
