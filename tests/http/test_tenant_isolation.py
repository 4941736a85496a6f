"""Tenant isolation of stored history on every backend: with identities from two tenants' API keys, tenant B
can neither read, chain from, append to nor delete tenant A's responses and conversations, and its attempts
change nothing A sees. Real node, real sim worker, real Redis / Postgres (a fresh prefix each, removed after).
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI

from node.app import run_node
from node.auth.config import AuthConfig
from node.auth.keys import new_key
from node.cluster.config import ClusterConfig
from node.sim.worker import SimWorker
from storage.config import StorageConfig
from tests.http.conftest import fast_sim, node_config
from tests.storage.conftest import PG_PORT, PG_URL, REDIS_PORT, REDIS_URL, delete_keys, drop_tables, port_open

BOOTSTRAP, _ = new_key()


@contextlib.asynccontextmanager
async def _storage(backend: str) -> AsyncIterator[StorageConfig]:
    if backend == "memory":
        yield StorageConfig()
        return
    if not port_open(REDIS_PORT if backend == "redis" else PG_PORT):
        pytest.skip(f"{backend} is not running on 127.0.0.1")
    prefix = f"iso{uuid.uuid4().hex[:10]}"
    try:
        if backend == "redis":
            yield StorageConfig(backend="redis", redis_url=REDIS_URL, key_prefix=prefix)
        else:
            yield StorageConfig(backend="postgres", postgres_url=PG_URL, table_prefix=prefix + "_")
    finally:
        if backend == "redis":
            await delete_keys(REDIS_URL, prefix)
        else:
            await drop_tables(PG_URL, prefix + "_")


async def _refused(call: Callable[[], Awaitable[Any]]) -> None:
    """Another tenant's object does not exist for the caller: 404, never 403 (which would confirm it)."""
    with pytest.raises(openai.NotFoundError):
        await call()


@pytest.mark.parametrize("backend", ["memory", "redis", "postgres"])
async def test_a_tenant_cannot_reach_another_tenants_responses_or_conversations(
    llama3_model_dir: Path, backend: str
) -> None:
    async with contextlib.AsyncExitStack() as stack:
        storage = await stack.enter_async_context(_storage(backend))
        sim = await stack.enter_async_context(SimWorker(fast_sim(llama3_model_dir)))
        config = dataclasses.replace(
            node_config(llama3_model_dir, [sim.port]),
            auth=AuthConfig(auth_bootstrap_key=BOOTSTRAP),
            cluster=ClusterConfig(mesh_bind="127.0.0.1:0", mesh_profile="local"),
            storage=storage,
        )
        node = await stack.enter_async_context(run_node(config))
        session = await stack.enter_async_context(aiohttp.ClientSession())
        keys = []
        for tenant in ("tenant-a", "tenant-b"):
            async with session.post(
                node.url + "/admin/keys",
                json={"tenant": tenant, "role": "user"},
                headers={"Authorization": f"Bearer {BOOTSTRAP}"},
            ) as r:
                assert r.status == 201, await r.text()
                keys.append((await r.json())["key"])
        a = await stack.enter_async_context(AsyncOpenAI(base_url=f"{node.url}/v1", api_key=keys[0], max_retries=0))
        b = await stack.enter_async_context(AsyncOpenAI(base_url=f"{node.url}/v1", api_key=keys[1], max_retries=0))
        model = node.model.name

        first = await a.responses.create(model=model, input="One", max_output_tokens=4)
        conv = await a.conversations.create(items=[{"role": "user", "content": "Hello"}])

        await _refused(lambda: b.responses.retrieve(first.id))
        await _refused(lambda: b.responses.input_items.list(first.id))
        await _refused(
            lambda: b.responses.create(model=model, input="Two", previous_response_id=first.id, max_output_tokens=4)
        )
        await _refused(lambda: b.responses.delete(first.id))
        await _refused(lambda: b.conversations.retrieve(conv.id))
        await _refused(lambda: b.conversations.items.list(conv.id))
        await _refused(lambda: b.conversations.items.create(conv.id, items=[{"role": "user", "content": "Mine"}]))
        await _refused(
            lambda: b.responses.create(model=model, input="Three", conversation=conv.id, max_output_tokens=4)
        )
        await _refused(lambda: b.conversations.delete(conv.id))

        # Nothing B tried changed what A has.
        assert (await a.responses.retrieve(first.id)).id == first.id
        listed = [i async for i in a.conversations.items.list(conv.id, order="asc")]
        assert [i.content[0].text for i in listed] == ["Hello"]  # type: ignore[union-attr]
        chained = await a.responses.create(model=model, input="Two", previous_response_id=first.id, max_output_tokens=4)
        assert chained.previous_response_id == first.id
        # And A's own delete still works.
        await a.responses.delete(first.id)
        await a.conversations.delete(conv.id)
        await _refused(lambda: a.responses.retrieve(first.id))
