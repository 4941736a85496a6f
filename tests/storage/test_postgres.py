"""Postgres backend specifics: migrations (concurrent, incremental, tamper-evident), transient-error
retries, fast failure, and recovery after outages and killed connections."""

from __future__ import annotations

import asyncio
import random
import socket
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import asyncpg
import asyncpg.exceptions as pgexc
import pytest

from storage import (
    Conversation,
    Item,
    MigrationError,
    ResponseRecord,
    StorageConfig,
    StorageUnavailable,
    open_stores,
)
from storage.migrate import MIGRATIONS_DIR, load_migrations, migrate
from storage.postgres import MAX_ATTEMPTS, retry_transient

ProxyFactory = Callable[..., Awaitable[Any]]
OUTAGE_TIMEOUT_S = 1.0
FAST_FAIL_BOUND_S = 2 * OUTAGE_TIMEOUT_S + 0.5
N_MIGRATORS = 6


def unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def msg(item_id: str) -> Item:
    return Item.from_json({"id": item_id, "type": "message", "role": "user", "content": "x"})


def pg_config(url: str, table_prefix: str, **kw: Any) -> StorageConfig:
    return StorageConfig(backend="postgres", postgres_url=url, table_prefix=table_prefix, **kw)


async def expect_fast_unavailable(op: Callable[[], Awaitable[object]]) -> None:
    start = time.monotonic()
    with pytest.raises(StorageUnavailable):
        await op()
    assert time.monotonic() - start < FAST_FAIL_BOUND_S


async def test_concurrent_migrations_apply_each_version_once(postgres_url: str, fresh_table_prefix: str) -> None:
    conns = await asyncio.gather(*(asyncpg.connect(postgres_url) for _ in range(N_MIGRATORS)))
    try:
        applied = await asyncio.gather(*(migrate(c, fresh_table_prefix, timeout_s=30) for c in conns))
        versions = [m.version for m in load_migrations()]
        assert sorted(v for run in applied for v in run) == versions
        rows = await conns[0].fetch(f"SELECT version FROM {fresh_table_prefix}schema_migrations ORDER BY 1")
        assert [r[0] for r in rows] == versions
    finally:
        await asyncio.gather(*(c.close() for c in conns))


async def test_nodes_opening_together_share_one_schema(postgres_url: str, fresh_table_prefix: str, tenant: str) -> None:
    async with AsyncExitStack() as stack:
        opened = await asyncio.gather(
            *(stack.enter_async_context(open_stores(pg_config(postgres_url, fresh_table_prefix))) for _ in range(4))
        )
        await opened[0].responses.put(tenant, ResponseRecord("resp_1", 0, {}), [msg("a")])
        for s in opened:
            assert (await s.responses.get(tenant, "resp_1")).id == "resp_1"


async def test_new_migration_is_applied_incrementally(
    postgres_url: str, fresh_table_prefix: str, tmp_path: Path
) -> None:
    (tmp_path / "0001_initial.sql").write_text((MIGRATIONS_DIR / "0001_initial.sql").read_text())
    conn = await asyncpg.connect(postgres_url)
    try:
        assert await migrate(conn, fresh_table_prefix, timeout_s=30, migrations=load_migrations(tmp_path)) == [1]
        (tmp_path / "0002_index.sql").write_text(
            "CREATE INDEX {prefix}responses_created ON {prefix}responses (created_at);"
        )
        assert await migrate(conn, fresh_table_prefix, timeout_s=30, migrations=load_migrations(tmp_path)) == [2]
        assert await migrate(conn, fresh_table_prefix, timeout_s=30, migrations=load_migrations(tmp_path)) == []
        # A node still shipping only 0001 keeps working against the newer schema.
        assert await migrate(conn, fresh_table_prefix, timeout_s=30) == []
    finally:
        await conn.close()


async def test_edited_migration_is_refused(postgres_url: str, fresh_table_prefix: str) -> None:
    async with open_stores(pg_config(postgres_url, fresh_table_prefix)):
        pass
    conn = await asyncpg.connect(postgres_url)
    try:
        await conn.execute(f"UPDATE {fresh_table_prefix}schema_migrations SET checksum = 'edited'")
    finally:
        await conn.close()
    with pytest.raises(MigrationError, match="edited"):
        async with open_stores(pg_config(postgres_url, fresh_table_prefix)):
            pass


def test_migration_files_must_be_numbered_without_gaps(tmp_path: Path) -> None:
    (tmp_path / "0001_a.sql").write_text("SELECT 1;")
    (tmp_path / "0003_c.sql").write_text("SELECT 1;")
    with pytest.raises(MigrationError, match="gaps"):
        load_migrations(tmp_path)
    (tmp_path / "0002-b.sql").write_text("SELECT 1;")
    with pytest.raises(MigrationError, match="NNNN_name"):
        load_migrations(tmp_path)


async def test_retry_transient_retries_conflicts_then_gives_up() -> None:
    sleeps: list[float] = []

    async def sleep(s: float) -> None:
        sleeps.append(s)

    failures = [pgexc.SerializationError("40001"), pgexc.DeadlockDetectedError("40P01")]

    async def flaky() -> str:
        if failures:
            raise failures.pop(0)
        return "done"

    assert await retry_transient(flaky, rng=random.Random(1), sleep=sleep) == "done"
    assert len(sleeps) == 2 and all(0 <= s <= 0.01 for s in sleeps)

    async def always() -> None:
        raise pgexc.SerializationError("40001")

    sleeps.clear()
    with pytest.raises(StorageUnavailable):
        await retry_transient(always, rng=random.Random(1), sleep=sleep)
    assert len(sleeps) == MAX_ATTEMPTS - 1

    async def broken() -> None:
        raise pgexc.UndefinedTableError("42P01")

    sleeps.clear()
    with pytest.raises(pgexc.UndefinedTableError):
        await retry_transient(broken, rng=random.Random(1), sleep=sleep)
    assert sleeps == []


async def test_unreachable_server_fails_fast(table_prefix: str, tenant: str) -> None:
    url = f"postgresql://postgres@127.0.0.1:{unused_port()}/test"
    config = pg_config(url, table_prefix, connect_timeout_s=OUTAGE_TIMEOUT_S, command_timeout_s=OUTAGE_TIMEOUT_S)
    async with open_stores(config) as s:  # opens anyway: the node can serve everything else
        await expect_fast_unavailable(lambda: s.responses.get(tenant, "resp_1"))
        await expect_fast_unavailable(lambda: s.conversations.create(tenant, Conversation("conv_1", 0)))


async def test_unresponsive_server_times_out(tcp_proxy: ProxyFactory, table_prefix: str, tenant: str) -> None:
    proxy = await tcp_proxy(5432, blackhole=True)
    url = f"postgresql://postgres@127.0.0.1:{proxy.port}/test"
    config = pg_config(url, table_prefix, connect_timeout_s=OUTAGE_TIMEOUT_S, command_timeout_s=OUTAGE_TIMEOUT_S)
    async with open_stores(config) as s:
        await expect_fast_unavailable(lambda: s.responses.get(tenant, "resp_1"))


async def test_outage_and_recovery_through_a_cut_connection(
    tcp_proxy: ProxyFactory, fresh_table_prefix: str, tenant: str
) -> None:
    """The server disappears (listener closed, live connections cut) and returns on the same address.
    The store is opened while it is down, so the first call after recovery also runs the migrations."""
    proxy = await tcp_proxy(5432)
    await proxy.stop()
    url = f"postgresql://postgres@127.0.0.1:{proxy.port}/test"
    config = pg_config(url, fresh_table_prefix, connect_timeout_s=OUTAGE_TIMEOUT_S, command_timeout_s=OUTAGE_TIMEOUT_S)
    async with open_stores(config) as s:
        await expect_fast_unavailable(lambda: s.conversations.get(tenant, "conv_1"))
        await proxy.start()
        await s.conversations.create(tenant, Conversation("conv_1", 0), [msg("a")])
        await proxy.stop()
        await expect_fast_unavailable(lambda: s.conversations.add_items(tenant, "conv_1", [msg("b")]))
        await proxy.start()
        await s.conversations.add_items(tenant, "conv_1", [msg("b")])
        assert [i.id for i in (await s.conversations.list_items(tenant, "conv_1", order="asc")).items] == [
            "a",
            "b",
        ]


async def test_terminated_backends_are_replaced(postgres_url: str, table_prefix: str, tenant: str) -> None:
    config = pg_config(postgres_url, table_prefix, postgres_pool_min_size=2)
    async with open_stores(config) as s:
        await s.responses.put(tenant, ResponseRecord("resp_1", 0, {}), [msg("a")])
        admin = await asyncpg.connect(postgres_url)
        try:
            killed = await admin.fetchval(
                "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = $1 AND datname = current_database()) t",
                f"smg-node-storage:{table_prefix}",
            )
        finally:
            await admin.close()
        assert killed >= 1
        await asyncio.sleep(0.1)  # let the client notice the closed sockets
        for _ in range(4):  # every pooled connection was killed; each call still succeeds
            assert (await s.responses.get(tenant, "resp_1")).id == "resp_1"
