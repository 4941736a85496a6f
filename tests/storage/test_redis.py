"""Redis backend specifics: key layout and TTLs, real expiry, fast failure and recovery across a real
server restart, and bounded waits against a server that never answers."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis

from storage import (
    Conversation,
    Item,
    NotFound,
    ResponseRecord,
    StorageConfig,
    StorageUnavailable,
    open_stores,
)

ProxyFactory = Callable[..., Awaitable[Any]]

OUTAGE_TIMEOUT_S = 1.0
# A call during an outage must fail within its timeouts plus scheduling slack, never hang.
FAST_FAIL_BOUND_S = 2 * OUTAGE_TIMEOUT_S + 0.5


def msg(item_id: str) -> Item:
    return Item.from_json({"id": item_id, "type": "message", "role": "user", "content": "x"})


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    await client.aclose()


async def test_keys_are_namespaced_and_carry_the_retention_ttl(
    redis_url: str, redis_client: aioredis.Redis, fresh_key_prefix: str, tenant: str
) -> None:
    prefix = fresh_key_prefix
    config = StorageConfig(backend="redis", redis_url=redis_url, key_prefix=prefix, retention_s=100)
    async with open_stores(config) as s:
        await s.conversations.create(tenant, Conversation("conv_1", 0), [msg("a")])
        await s.responses.put(tenant, ResponseRecord("resp_1", 0, {}, conversation_id="conv_1"), [msg("b")])
        keys = sorted([k async for k in redis_client.scan_iter(match=f"{prefix}:*")])
        base = f"{prefix}:{tenant}"
        entry_keys = [f"{base}:r:resp_1", f"{base}:r:resp_1:in", f"{base}:r:resp_1:ix"]
        entry_keys += [f"{base}:c:conv_1", f"{base}:c:conv_1:o", f"{base}:c:conv_1:i"]
        assert keys == sorted([f"{base}:seq", *entry_keys])
        for key in entry_keys:
            assert 95_000 < await redis_client.pttl(key) <= 100_000, key
        # The response counter outlives every response it numbered.
        assert 195_000 < await redis_client.pttl(f"{base}:seq") <= 200_000
        # A write to the conversation refreshes the TTL of all its keys.
        conv_keys = [k for k in entry_keys if ":c:" in k]
        for key in conv_keys:
            await redis_client.pexpire(key, 5_000)
        await s.conversations.add_items(tenant, "conv_1", [msg("c")])
        for key in conv_keys:
            assert await redis_client.pttl(key) > 95_000, key


async def test_entries_really_expire(redis_url: str, key_prefix: str, tenant: str) -> None:
    config = StorageConfig(backend="redis", redis_url=redis_url, key_prefix=key_prefix, retention_s=0.3)
    async with open_stores(config) as s:
        await s.responses.put(tenant, ResponseRecord("resp_1", 0, {}), [msg("a")])
        await s.conversations.create(tenant, Conversation("conv_1", 0), [msg("a")])
        await s.responses.get(tenant, "resp_1")
        time.sleep(0.4)  # noqa: ASYNC251 - nothing else runs on this loop
        with pytest.raises(NotFound):
            await s.responses.get(tenant, "resp_1")
        with pytest.raises(NotFound):
            await s.conversations.list_items(tenant, "conv_1")


async def expect_fast_unavailable(op: Callable[[], Awaitable[object]]) -> None:
    start = time.monotonic()
    with pytest.raises(StorageUnavailable):
        await op()
    assert time.monotonic() - start < FAST_FAIL_BOUND_S


async def test_outage_fails_fast_and_recovers_without_reopening(private_redis: Any, tenant: str) -> None:
    config = StorageConfig(
        backend="redis",
        redis_url=f"redis://127.0.0.1:{private_redis.port}/0",
        key_prefix="outage",
        connect_timeout_s=OUTAGE_TIMEOUT_S,
        command_timeout_s=OUTAGE_TIMEOUT_S,
    )
    async with open_stores(config) as s:
        await s.conversations.create(tenant, Conversation("conv_1", 0), [msg("a")])
        private_redis.shutdown()
        await expect_fast_unavailable(lambda: s.conversations.get(tenant, "conv_1"))
        await expect_fast_unavailable(lambda: s.conversations.add_items(tenant, "conv_1", [msg("b")]))
        await expect_fast_unavailable(lambda: s.responses.put(tenant, ResponseRecord("resp_1", 0, {}), []))
        private_redis.start()  # same port, empty (nosave)
        await s.conversations.create(tenant, Conversation("conv_1", 0), [msg("a")])
        await s.conversations.add_items(tenant, "conv_1", [msg("b")])  # scripts are re-loaded (NOSCRIPT)
        assert len((await s.conversations.list_items(tenant, "conv_1")).items) == 2
        # And a crash (SIGKILL) mid-session behaves the same.
        private_redis.kill()
        await expect_fast_unavailable(lambda: s.conversations.get(tenant, "conv_1"))
        private_redis.start()
        with pytest.raises(NotFound):
            await s.conversations.get(tenant, "conv_1")


async def test_unresponsive_server_times_out(tcp_proxy: ProxyFactory, tenant: str) -> None:
    proxy = await tcp_proxy(6379, blackhole=True)
    config = StorageConfig(
        backend="redis",
        redis_url=f"redis://127.0.0.1:{proxy.port}/0",
        connect_timeout_s=OUTAGE_TIMEOUT_S,
        command_timeout_s=OUTAGE_TIMEOUT_S,
    )
    async with open_stores(config) as s:
        await expect_fast_unavailable(lambda: s.responses.get(tenant, "resp_1"))
