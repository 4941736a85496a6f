"""Postgres backend specifics: migrations (concurrent, incremental, tamper-evident), transient-error
retries, fast failure, recovery after outages and killed connections, and the retention sweeper."""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import asyncpg.exceptions as pgexc
import pytest

from storage import (
    Conversation,
    Item,
    MigrationError,
    NotFound,
    ResponseRecord,
    StorageConfig,
    StorageUnavailable,
    Stores,
    open_stores,
)
from storage.errors import StorageContended
from storage.migrate import MIGRATIONS_DIR, load_migrations, lock_key, migrate
from storage.postgres import MAX_ATTEMPTS, open_postgres_stores, retry_transient, swept_tables
from storage.sweeper import sweep_expired, sweep_if_free, sweep_periodically
from tests.storage.conftest import FakeClock
from tests.storage.contention import churned_conversation

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
    shipped = [m.version for m in load_migrations()]
    for path in MIGRATIONS_DIR.glob("*.sql"):
        (tmp_path / path.name).write_text(path.read_text())
    conn = await asyncpg.connect(postgres_url)
    try:
        assert await migrate(conn, fresh_table_prefix, timeout_s=30, migrations=load_migrations(tmp_path)) == shipped
        nxt = len(shipped) + 1
        (tmp_path / f"{nxt:04d}_index.sql").write_text(
            "CREATE INDEX {prefix}responses_created ON {prefix}responses (created_at);"
        )
        assert await migrate(conn, fresh_table_prefix, timeout_s=30, migrations=load_migrations(tmp_path)) == [nxt]
        assert await migrate(conn, fresh_table_prefix, timeout_s=30, migrations=load_migrations(tmp_path)) == []
        # A node still shipping fewer migrations keeps working against the newer schema.
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
    with pytest.raises(StorageContended) as gave_up:
        await retry_transient(always, rng=random.Random(1), sleep=sleep)
    assert len(sleeps) == MAX_ATTEMPTS - 1
    assert not isinstance(gave_up.value, StorageUnavailable), "contention is not an outage"

    async def broken() -> None:
        raise pgexc.UndefinedTableError("42P01")

    sleeps.clear()
    with pytest.raises(pgexc.UndefinedTableError):
        await retry_transient(broken, rng=random.Random(1), sleep=sleep)
    assert sleeps == []


# ---- contention against the real server -----------------------------------------------------------
# The store's own transactions lose a real conflict on their first attempt; retry_transient re-runs them.


def with_settings(url: str, **settings: str) -> str:
    """`url` with server settings for every connection of the store's pool (asyncpg passes unknown DSN
    query parameters to the server)."""
    return url + "?" + "&".join(f"{k}={v.replace(' ', '%20')}" for k, v in settings.items())


async def wait_for_lock_wait(admin: asyncpg.Connection[Any], table_prefix: str) -> None:
    """Until one of the store's connections is blocked on a lock held elsewhere."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        waiting = await admin.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'",
            f"smg-node-storage:{table_prefix}",
        )
        if waiting:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the store never waited for the helper's lock")


def conversation_turn(rid: str, conv_id: str) -> ResponseRecord:
    return ResponseRecord(rid, 0, {}, output=(msg(f"{rid}_out"),), conversation_id=conv_id)


@asynccontextmanager
async def admin_and_helper(url: str) -> AsyncIterator[tuple[asyncpg.Connection[Any], asyncpg.Connection[Any]]]:
    """Two connections beside the store's pool: one watches pg_stat_activity, the other holds locks."""
    admin, helper = await asyncpg.connect(url), await asyncpg.connect(url)
    try:
        yield admin, helper
    finally:
        await helper.close()
        await admin.close()


async def assert_turn_stored(s: Stores, tenant: str) -> None:
    """The contended put of resp_1 landed whole: the response, and its items appended to conv_1."""
    assert (await s.responses.get(tenant, "resp_1")).conversation_id == "conv_1"
    items = (await s.conversations.list_items(tenant, "conv_1", order="asc")).items
    assert [i.id for i in items] == ["a", "b", "resp_1_out"]


def retries_logged(caplog: pytest.LogCaptureFixture, sqlstate: str) -> int:
    return sum(1 for r in caplog.records if r.name == "storage.postgres" and f"SQLSTATE {sqlstate}" in r.getMessage())


async def test_serialization_failure_is_retried_to_completion(
    postgres_url: str, fresh_table_prefix: str, tenant: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The store runs at REPEATABLE READ; a helper transaction holds the conversation row's lock while the
    store's put (with a conversation) updates that row. When the helper commits, the store's attempt fails
    with 40001 (concurrent update) and the re-run succeeds."""
    url = with_settings(postgres_url, default_transaction_isolation="repeatable read")
    t = fresh_table_prefix
    async with open_stores(pg_config(url, t)) as s:
        await s.conversations.create(tenant, Conversation("conv_1", 0), [msg("a")])
        async with admin_and_helper(postgres_url) as (admin, helper):
            await helper.execute("BEGIN")
            await helper.execute(f"UPDATE {t}conversations SET metadata = '{{}}' WHERE tenant = $1", tenant)
            with caplog.at_level(logging.DEBUG, logger="storage.postgres"):
                put = asyncio.create_task(s.responses.put(tenant, conversation_turn("resp_1", "conv_1"), [msg("b")]))
                await wait_for_lock_wait(admin, t)
                await helper.execute("COMMIT")
                await asyncio.wait_for(put, timeout=5)
    async with open_stores(pg_config(postgres_url, t)) as s:
        await assert_turn_stored(s, tenant)
    assert retries_logged(caplog, "40001") == 1


async def test_deadlock_is_retried_to_completion(
    postgres_url: str, fresh_table_prefix: str, tenant: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A real deadlock at the default isolation: a helper transaction inserts (uncommitted) the response id
    the store's put is about to insert; the put locks the conversation row and waits for that insert; the
    helper then updates the conversation row. Postgres breaks the cycle by aborting the store's attempt (its
    deadlock_timeout is the shorter one, so it runs the check); the helper rolls back and the re-run commits."""
    url = with_settings(postgres_url, deadlock_timeout="50ms")
    t = fresh_table_prefix
    async with open_stores(pg_config(url, t)) as s:
        await s.conversations.create(tenant, Conversation("conv_1", 0), [msg("a")])
        async with admin_and_helper(postgres_url) as (admin, helper):
            await helper.execute("BEGIN")
            await helper.execute("SET LOCAL deadlock_timeout = '60s'")
            columns = "tenant, id, created_at, body, output"
            await helper.execute(f"INSERT INTO {t}responses ({columns}) VALUES ($1, 'resp_1', 0, '{{}}', '[]')", tenant)
            with caplog.at_level(logging.DEBUG, logger="storage.postgres"):
                put = asyncio.create_task(s.responses.put(tenant, conversation_turn("resp_1", "conv_1"), [msg("b")]))
                await wait_for_lock_wait(admin, t)
                # Blocks on the store's lock of the conversation row until the store's attempt is aborted.
                updated = await asyncio.wait_for(
                    helper.execute(f"UPDATE {t}conversations SET metadata = '{{}}' WHERE tenant = $1", tenant), 10
                )
                assert updated == "UPDATE 1"
                assert not put.done()  # the store's first attempt is gone; its re-run waits for the helper
                await helper.execute("ROLLBACK")
                await asyncio.wait_for(put, timeout=5)
        await assert_turn_stored(s, tenant)
    assert retries_logged(caplog, "40P01") == 1


async def test_lasting_contention_gives_up_with_storage_contended(
    postgres_url: str, fresh_table_prefix: str, tenant: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Every attempt of the store's put loses to a helper that keeps committing updates of the conversation
    row (the store at REPEATABLE READ): after MAX_ATTEMPTS it gives up with StorageContended, not
    StorageUnavailable, having written nothing; the store keeps working for everything else."""
    url = with_settings(postgres_url, default_transaction_isolation="repeatable read")
    t = fresh_table_prefix
    async with open_stores(pg_config(url, t)) as s:
        await s.conversations.create(tenant, Conversation("conv_1", 0), [msg("a")])
        with caplog.at_level(logging.DEBUG, logger="storage.postgres"):
            async with churned_conversation(postgres_url, t, tenant, "conv_1"):
                with pytest.raises(StorageContended) as gave_up:
                    await s.responses.put(tenant, conversation_turn("resp_1", "conv_1"), [msg("b")])
                assert not isinstance(gave_up.value, StorageUnavailable)
                await s.responses.put(tenant, ResponseRecord("resp_other", 0, {}), [msg("c")])  # not contended
        assert retries_logged(caplog, "40001") == MAX_ATTEMPTS - 1
        with pytest.raises(NotFound):
            await s.responses.get(tenant, "resp_1")
        assert [i.id for i in (await s.conversations.list_items(tenant, "conv_1")).items] == ["a"]
        await s.responses.put(tenant, conversation_turn("resp_1", "conv_1"), [msg("b")])  # contention over


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


# ---- retention -------------------------------------------------------------------------------------
# Visibility of expired entries is in the shared contract (test_contract.py); here: the sweeper.
RETENTION_S = 10.0


async def row_counts(url: str, table_prefix: str) -> dict[str, int]:
    conn = await asyncpg.connect(url)
    try:
        counts: dict[str, int] = {}
        for table in swept_tables(table_prefix):
            for name in (table.owners, table.children):
                counts[name.removeprefix(table_prefix)] = await conn.fetchval(f"SELECT count(*) FROM {name}")
        return counts
    finally:
        await conn.close()


def at(clock: FakeClock) -> datetime:
    return datetime.fromtimestamp(clock(), UTC)


async def write_old_and_new(s: Stores, clock: FakeClock, tenant: str) -> None:
    """Old: 5 responses with 3 inputs, conversations conv_old_0/1 with 40 items. New (written
    RETENTION_S * 0.6 later, when conv_old_1 gets one more item): 2 responses with 2 inputs, conv_new with
    3 items. The clock ends RETENTION_S * 1.2 after the start: the old entries except conv_old_1 expired."""
    for n in range(5):
        await s.responses.put(tenant, ResponseRecord(f"resp_old_{n}", 0, {}), [msg(f"o{n}_{i}") for i in range(3)])
    for cid in ("conv_old_0", "conv_old_1"):
        await s.conversations.create(tenant, Conversation(cid, 0), [msg(f"a{i}") for i in range(20)])
        await s.conversations.add_items(tenant, cid, [msg(f"b{i}") for i in range(20)])
    clock.now_s += RETENTION_S * 0.6
    await s.conversations.add_items(tenant, "conv_old_1", [msg("c")])
    await s.responses.put(tenant, ResponseRecord("resp_new_0", 0, {}), [msg("n0"), msg("n1")])
    await s.responses.put(
        tenant, ResponseRecord("resp_new_1", 0, {}, previous_response_id="resp_new_0"), [msg("n2"), msg("n3")]
    )
    await s.conversations.create(tenant, Conversation("conv_new", 0), [msg("x"), msg("y"), msg("z")])
    clock.now_s += RETENTION_S * 0.6


BEFORE_SWEEP = {"responses": 7, "response_input_items": 19, "conversations": 3, "conversation_items": 84}
AFTER_SWEEP = {"responses": 2, "response_input_items": 4, "conversations": 2, "conversation_items": 44}
SWEPT_ROWS = sum(BEFORE_SWEEP.values()) - sum(AFTER_SWEEP.values())


async def test_sweep_deletes_expired_rows_in_batches_and_keeps_live_ones(
    postgres_url: str, fresh_table_prefix: str, tenant: str
) -> None:
    clock = FakeClock()
    config = pg_config(postgres_url, fresh_table_prefix, retention_s=RETENTION_S)
    async with open_postgres_stores(config, clock=clock) as s:
        await write_old_and_new(s, clock, tenant)
        assert await row_counts(postgres_url, fresh_table_prefix) == BEFORE_SWEEP  # hidden, not yet deleted
        conn = await asyncpg.connect(postgres_url)
        try:
            tables = swept_tables(fresh_table_prefix)
            # Batches of 3 rows: many rounds, and a 40-item conversation spans 14 item batches.
            assert await sweep_expired(conn, tables, now=at(clock), batch_rows=3) == SWEPT_ROWS
            assert await row_counts(postgres_url, fresh_table_prefix) == AFTER_SWEEP
            assert await sweep_expired(conn, tables, now=at(clock), batch_rows=3) == 0
        finally:
            await conn.close()
        assert [i.id for i in await s.responses.load_chain(tenant, "resp_new_1")] == ["n0", "n1", "n2", "n3"]
        page = await s.conversations.list_items(tenant, "conv_old_1", limit=100, order="asc")
        assert [i.id for i in page.items] == [f"a{i}" for i in range(20)] + [f"b{i}" for i in range(20)] + ["c"]
        assert len((await s.conversations.list_items(tenant, "conv_new")).items) == 3


async def test_concurrent_sweepers_delete_each_row_once(
    postgres_url: str, fresh_table_prefix: str, tenant: str
) -> None:
    clock = FakeClock()
    config = pg_config(postgres_url, fresh_table_prefix, retention_s=RETENTION_S)
    async with open_postgres_stores(config, clock=clock) as s:
        await write_old_and_new(s, clock, tenant)
    conns = await asyncio.gather(*(asyncpg.connect(postgres_url) for _ in range(4)))
    try:
        tables = swept_tables(fresh_table_prefix)
        # Without the advisory lock, as if every node swept at the same moment.
        deleted = await asyncio.gather(*(sweep_expired(c, tables, now=at(clock), batch_rows=3) for c in conns))
        assert sum(deleted) == SWEPT_ROWS
        assert await row_counts(postgres_url, fresh_table_prefix) == AFTER_SWEEP
    finally:
        await asyncio.gather(*(c.close() for c in conns))


async def test_only_one_node_sweeps_at_a_time(postgres_url: str, fresh_table_prefix: str, tenant: str) -> None:
    clock = FakeClock()
    config = pg_config(postgres_url, fresh_table_prefix, retention_s=RETENTION_S)
    async with open_postgres_stores(config, clock=clock) as s:
        await write_old_and_new(s, clock, tenant)
    key = lock_key(fresh_table_prefix, "retention-sweep")
    holder, sweeper = await asyncio.gather(asyncpg.connect(postgres_url), asyncpg.connect(postgres_url))
    try:
        tables = swept_tables(fresh_table_prefix)
        await holder.execute("SELECT pg_advisory_lock($1)", key)
        assert await sweep_if_free(sweeper, tables, lock_key=key, now=at(clock)) is None
        assert await row_counts(postgres_url, fresh_table_prefix) == BEFORE_SWEEP
        await holder.execute("SELECT pg_advisory_unlock($1)", key)
        assert await sweep_if_free(sweeper, tables, lock_key=key, now=at(clock)) == SWEPT_ROWS
        # Released after the sweep: another session can take it.
        assert await holder.fetchval("SELECT pg_try_advisory_lock($1)", key)
    finally:
        await asyncio.gather(holder.close(), sweeper.close())


async def test_store_sweeps_in_the_background_until_closed(
    postgres_url: str, fresh_table_prefix: str, tenant: str
) -> None:
    clock = FakeClock()
    config = pg_config(postgres_url, fresh_table_prefix, retention_s=RETENTION_S, postgres_sweep_interval_s=0.05)
    async with open_postgres_stores(config, clock=clock) as s:
        await write_old_and_new(s, clock, tenant)
        deadline = time.monotonic() + 10
        while await row_counts(postgres_url, fresh_table_prefix) != AFTER_SWEEP:
            assert time.monotonic() < deadline, "the background sweeper did not delete the expired rows"
            await asyncio.sleep(0.05)
        task_name = f"postgres-retention-sweep:{fresh_table_prefix}"
        assert any(t.get_name() == task_name for t in asyncio.all_tasks())
    assert not any(t.get_name() == task_name for t in asyncio.all_tasks())


async def test_sweeper_outlives_failed_sweeps() -> None:
    outcomes: list[int | Exception] = [StorageUnavailable("down"), StorageUnavailable("down"), 3]
    done = asyncio.Event()

    async def sweep() -> int | None:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        done.set()
        return outcome

    task = asyncio.create_task(sweep_periodically(sweep, interval_s=0.01))
    try:
        await asyncio.wait_for(done.wait(), timeout=5)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert outcomes == []


async def test_rows_written_before_retention_existed_are_kept(
    postgres_url: str, fresh_table_prefix: str, tenant: str
) -> None:
    """Rows inserted without expires_at (before migration 0002, or by an older node during a rolling
    upgrade) were stored as "kept until deleted" and stay so."""
    clock = FakeClock()
    config = pg_config(postgres_url, fresh_table_prefix, retention_s=RETENTION_S)
    async with open_postgres_stores(config, clock=clock) as s:
        conn = await asyncpg.connect(postgres_url)
        try:
            await conn.execute(
                f"INSERT INTO {fresh_table_prefix}responses (tenant, id, created_at, body, output)"
                " VALUES ($1, 'resp_legacy', 0, '{}', '[]')",
                tenant,
            )
            clock.now_s += 50 * 365 * 24 * 3600.0
            assert await sweep_expired(conn, swept_tables(fresh_table_prefix), now=at(clock)) == 0
        finally:
            await conn.close()
        assert (await s.responses.get(tenant, "resp_legacy")).id == "resp_legacy"
