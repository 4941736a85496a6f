"""The Postgres backend (asyncpg pool), shared by all nodes and durable: a write is committed (and, with
the server default synchronous_commit=on, flushed) when the call returns.

Multi-row writes run in one transaction (or as one statement, atomic by itself). Serialization
failures and deadlocks (SQLSTATE 40001/40P01) re-run the whole transaction with bounded, jittered
backoff, then give up with StorageContended (the server is fine: not an outage). Connection failures are
not retried: they raise StorageUnavailable at once, and the pool replaces dead connections on the next
acquire, so the store recovers by itself when the server returns.

The schema is migrated when the store opens; if Postgres is down then, the store still opens and the
first call after the server returns migrates (see `_Database.ensure_schema`).

Retention, as in the memory and Redis backends: each write to a response or conversation sets its
`expires_at` to the write time plus `retention_s` (reads do not extend it; a response is written once, a
conversation on every change to it or its items). Every read and write treats a row with
expires_at <= now as absent, so it vanishes at its deadline, items included; a chain whose ancestor
expired is broken exactly as if the ancestor were deleted. An id may be reused once its row expired: the
write first deletes the expired row (so a reused response id still gets a fresh, larger seq). The
store's background sweeper (storage/sweeper.py) deletes expired rows in small batches every
`postgres_sweep_interval_s`. "now" is the injected wall clock of the node (unix seconds), so nodes
sharing a database need synchronized clocks; skew shifts a deadline by the skew.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Protocol, TypeAlias, TypeVar

import asyncpg
import asyncpg.exceptions as pgexc

from storage import codec, validation
from storage.base import (
    DEFAULT_MAX_CHAIN_DEPTH,
    DEFAULT_PAGE_LIMIT,
    Conversation,
    Item,
    ItemPage,
    Order,
    ResponseRecord,
    Stores,
)
from storage.config import StorageConfig
from storage.errors import Conflict, InvalidInput, NotFound, StorageContended, StorageError, StorageUnavailable
from storage.keys import StoredKey
from storage.migrate import lock_key, migrate
from storage.sweeper import OwnedTable, sweep_if_free, sweep_periodically

_log = logging.getLogger(__name__)

T = TypeVar("T")
# A string: the runtime class is not subscriptable, only the stubs are generic.
Conn: TypeAlias = "asyncpg.pool.PoolConnectionProxy[asyncpg.Record]"

# 40001/40P01 are resolved by re-running. 4 attempts with jittered sleeps of at most 5, 10, 20 ms between
# them: a contended call spends <= 35 ms backing off before it gives up with StorageContended.
MAX_ATTEMPTS = 4
BACKOFF_BASE_S = 0.005
_RETRYABLE = (pgexc.SerializationError, pgexc.DeadlockDetectedError)
# Server gone, restarting, refusing connections, read-only after failover, out of connections, or a
# timeout (asyncpg raises TimeoutError for connect, acquire and command_timeout).
_UNAVAILABLE = (
    OSError,
    TimeoutError,
    asyncpg.InterfaceError,
    pgexc.PostgresConnectionError,
    pgexc.OperatorInterventionError,
    pgexc.InsufficientResourcesError,
    pgexc.ReadOnlySQLTransactionError,
)
_MAX_POSITION = 2**62  # "after nothing" for descending pages: above every stored position


async def retry_transient(
    op: Callable[[], Awaitable[T]],
    *,
    attempts: int = MAX_ATTEMPTS,
    base_s: float = BACKOFF_BASE_S,
    rng: random.Random,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> T:
    """Run `op`, re-running it after serialization failures/deadlocks with full-jitter exponential backoff.

    Raises StorageContended when the last attempt also fails that way; other exceptions propagate.
    """
    for attempt in range(attempts):
        try:
            return await op()
        except _RETRYABLE as exc:
            if attempt + 1 == attempts:
                raise StorageContended(f"postgres: still conflicting after {attempts} attempts: {exc}") from exc
            _log.debug(
                "postgres: %s (SQLSTATE %s); re-running, attempt %d of %d", exc, exc.sqlstate, attempt + 2, attempts
            )
            await sleep(rng.uniform(0, base_s * 2**attempt))
    raise AssertionError("unreachable")


class _PagedSql(Protocol):
    """The three statements of an item list keyed by (tenant, owner id), ordered by position."""

    _sql_cursor: str
    _sql_page_asc: str
    _sql_page_desc: str


async def _fetch_page(
    conn: Conn,
    sql: _PagedSql,
    *,
    tenant: str,
    owner_id: str,
    after: str | None,
    limit: int,
    order: Order,
    now: datetime,
    missing: str,
    foreign: str,
) -> list[asyncpg.Record]:
    """One page (plus one row, to tell has_more) of an owner's items after the `after` item.

    Raises NotFound (``missing``) when the owner does not exist or expired, InvalidInput (``foreign``) when
    `after` is not one of its items.
    """
    exists, cursor = _one(await conn.fetchrow(sql._sql_cursor, tenant, owner_id, after, now))
    if not exists:
        raise NotFound(missing)
    if after is not None and cursor is None:
        raise InvalidInput(foreign)
    if order == "asc":
        return await conn.fetch(sql._sql_page_asc, tenant, owner_id, -1 if cursor is None else cursor, limit + 1)
    start = _MAX_POSITION if cursor is None else cursor
    return await conn.fetch(sql._sql_page_desc, tenant, owner_id, start, limit + 1)


def swept_tables(table_prefix: str) -> tuple[OwnedTable, OwnedTable]:
    """The expiring tables with their item tables, as named in migrations/: responses, conversations."""
    return (
        OwnedTable(f"{table_prefix}responses", f"{table_prefix}response_input_items", "response_id"),
        OwnedTable(f"{table_prefix}conversations", f"{table_prefix}conversation_items", "conversation_id"),
    )


class _Database:
    """The pool plus what both stores share: schema readiness, error mapping, retries, table names, the
    clock and retention."""

    def __init__(
        self,
        pool: asyncpg.Pool[asyncpg.Record],
        config: StorageConfig,
        rng: random.Random,
        clock: Callable[[], float],
    ) -> None:
        self._pool = pool
        self._config = config
        self._rng = rng
        self._clock = clock
        self._retention = timedelta(seconds=config.retention_s)
        self._ready = False
        self._schema_lock = asyncio.Lock()
        self.table_prefix = config.table_prefix
        self.swept = swept_tables(config.table_prefix)
        responses, conversations = self.swept
        self.responses, self.inputs = responses.owners, responses.children
        self.conversations, self.items = conversations.owners, conversations.children

    def now(self) -> datetime:
        return datetime.fromtimestamp(self._clock(), UTC)

    def deadline(self) -> tuple[datetime, datetime]:
        """(now, the expires_at a write made now gets)."""
        now = self.now()
        return now, now + self._retention

    async def sweep(self) -> int | None:
        """Delete expired rows unless another node is sweeping this table prefix (then None). Raises
        StorageUnavailable, StorageError."""

        async def op(conn: Conn) -> int | None:
            key = lock_key(self._config.table_prefix, "retention-sweep")
            return await sweep_if_free(conn, self.swept, lock_key=key, now=self.now())

        return await self.run(op)

    async def ensure_schema(self) -> None:
        """Migrate once per store. Raises StorageUnavailable (the next call tries again), MigrationError."""
        if not self._ready:
            async with self._schema_lock:
                await self._migrate_once()

    async def _migrate_once(self) -> None:
        if self._ready:  # another call migrated while this one waited for the lock
            return
        try:
            async with self._pool.acquire(timeout=self._config.connect_timeout_s) as conn:
                applied = await migrate(conn, self._config.table_prefix, timeout_s=self._config.migration_timeout_s)
        except _UNAVAILABLE as exc:
            raise StorageUnavailable(f"postgres unavailable: {exc!r}") from exc
        if applied:
            _log.info("applied postgres migrations %s (prefix %r)", applied, self._config.table_prefix)
        self._ready = True

    async def run(self, op: Callable[[Conn], Awaitable[T]]) -> T:
        """Run `op` on a pooled connection. `op` must be safe to re-run from scratch (it opens its own
        transaction). Raises what `op` raises from the storage tree, StorageUnavailable, StorageError."""
        await self.ensure_schema()

        async def attempt() -> T:
            async with self._pool.acquire(timeout=self._config.connect_timeout_s) as conn:
                return await op(conn)

        try:
            return await retry_transient(attempt, rng=self._rng)
        except StorageError:
            raise
        except _UNAVAILABLE as exc:
            raise StorageUnavailable(f"postgres unavailable: {exc!r}") from exc
        except asyncpg.PostgresError as exc:
            raise StorageError(f"postgres error: {exc!r}") from exc


def _item_columns(items: Sequence[Item]) -> tuple[list[str], list[str], list[str]]:
    return [i.id for i in items], [i.type for i in items], [codec.dumps(i.body) for i in items]


class PostgresResponseStore:
    def __init__(self, db: _Database) -> None:
        self._db = db
        t = db
        # Every statement on responses takes the node's now and treats rows with expires_at <= now as
        # absent; the insert sets expires_at to now + retention (see the module docstring).
        self._sql_prev = f"SELECT 1 FROM {t.responses} WHERE tenant = $1 AND id = $2 AND expires_at > $3"
        self._sql_bump = _conv_bump(t.conversations)
        self._sql_insert = (
            f"INSERT INTO {t.responses} (tenant, id, created_at, previous_response_id, conversation_id,"
            " body, output, expires_at) VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7::jsonb, $8)"
            " ON CONFLICT DO NOTHING RETURNING seq"
        )
        self._sql_purge = _purge(t.responses)
        self._sql_inputs = (
            f"INSERT INTO {t.inputs} (tenant, response_id, position, item_id, type, body)"
            " SELECT $1, $2, u.ord - 1, u.id, u.type, u.body::jsonb"
            " FROM unnest($3::text[], $4::text[], $5::text[]) WITH ORDINALITY AS u(id, type, body, ord)"
        )
        self._sql_conv_items = _conv_items_insert(t.items)
        # The common put (no conversation) as one statement: atomic on its own, one round trip. Data-
        # modifying CTEs run exactly once; the items insert joins `ins`, so it adds rows only if the
        # response row was inserted. Returns (previous exists, new seq or NULL on id conflict).
        self._sql_put_one = (
            f"WITH prev_ok AS (SELECT $4::text IS NULL OR EXISTS (SELECT 1 FROM {t.responses}"
            " WHERE tenant = $1 AND id = $4 AND expires_at > $10) AS ok),"
            f" ins AS (INSERT INTO {t.responses} (tenant, id, created_at, previous_response_id,"
            " conversation_id, body, output, expires_at)"
            " SELECT $1, $2, $3, $4, NULL, $5::jsonb, $6::jsonb, $11 FROM prev_ok WHERE ok"
            " ON CONFLICT DO NOTHING RETURNING seq),"
            f" items AS (INSERT INTO {t.inputs} (tenant, response_id, position, item_id, type, body)"
            " SELECT $1, $2, u.ord - 1, u.id, u.type, u.body::jsonb FROM ins,"
            " unnest($7::text[], $8::text[], $9::text[]) WITH ORDINALITY AS u(id, type, body, ord))"
            " SELECT (SELECT ok FROM prev_ok), (SELECT seq FROM ins)"
        )
        self._sql_get = (
            "SELECT created_at, previous_response_id, conversation_id, body::text, output::text"
            f" FROM {t.responses} WHERE tenant = $1 AND id = $2 AND expires_at > $3"
        )
        self._sql_delete = f"DELETE FROM {t.responses} WHERE tenant = $1 AND id = $2 AND expires_at > $3 RETURNING 1"
        self._sql_cursor = (
            f"SELECT EXISTS (SELECT 1 FROM {t.responses} WHERE tenant = $1 AND id = $2 AND expires_at > $4),"
            f" (SELECT position FROM {t.inputs} WHERE tenant = $1 AND response_id = $2 AND item_id = $3)"
        )
        page = f"SELECT body::text FROM {t.inputs} WHERE tenant = $1 AND response_id = $2"
        self._sql_page_asc = f"{page} AND position > $3::bigint ORDER BY position ASC LIMIT $4"
        self._sql_page_desc = f"{page} AND position < $3::bigint ORDER BY position DESC LIMIT $4"
        # Follows links only to strictly smaller seq (see ResponseStore.load_chain) and only to unexpired
        # responses; depth-bounded.
        self._sql_chain = (
            "WITH RECURSIVE chain AS ("
            f" SELECT id, seq, previous_response_id, output, 1 AS depth FROM {t.responses}"
            " WHERE tenant = $1 AND id = $2 AND expires_at > $4"
            " UNION ALL"
            " SELECT r.id, r.seq, r.previous_response_id, r.output, c.depth + 1"
            f" FROM chain c JOIN {t.responses} r"
            " ON r.tenant = $1 AND r.id = c.previous_response_id AND r.seq < c.seq AND r.expires_at > $4"
            " WHERE c.depth < $3)"
            " SELECT id, previous_response_id, depth, output::text FROM chain ORDER BY depth DESC"
        )
        self._sql_chain_inputs = (
            f"SELECT response_id, body::text FROM {t.inputs}"
            " WHERE tenant = $1 AND response_id = ANY($2::text[]) ORDER BY response_id, position"
        )

    async def put(self, tenant: str, response: ResponseRecord, input_items: Sequence[Item]) -> None:
        validation.check_tenant(tenant)
        validation.check_response(response, input_items)
        prev, conv_id = response.previous_response_id, response.conversation_id
        body, output = codec.dumps(response.body), codec.dumps([i.body for i in response.output])
        in_cols = _item_columns(input_items)
        conv_items = (*input_items, *response.output)
        conv_cols = _item_columns(conv_items)
        conflict = f"response {response.id!r} already exists"

        async def put_one(conn: Conn) -> None:
            # At most two tries: the second follows deleting an expired response that held the id.
            for _ in range(2):
                now, expires = self._db.deadline()
                args = (tenant, response.id, response.created_at, prev, body, output, *in_cols, now, expires)
                prev_ok, seq = _one(await conn.fetchrow(self._sql_put_one, *args))
                if not prev_ok:
                    raise NotFound(f"previous response {prev!r} not found")
                if seq is not None:
                    return
                if await conn.fetchval(self._sql_purge, tenant, response.id, now) is None:
                    break
            raise Conflict(conflict)

        async def op(conn: Conn) -> None:
            now, expires = self._db.deadline()
            try:
                async with conn.transaction():
                    if prev is not None and await conn.fetchval(self._sql_prev, tenant, prev, now) is None:
                        raise NotFound(f"previous response {prev!r} not found")
                    next_position = None
                    if conv_id is not None:
                        next_position = await conn.fetchval(
                            self._sql_bump, tenant, conv_id, len(conv_items), now, expires
                        )
                        if next_position is None:
                            raise NotFound(f"conversation {conv_id!r} not found")
                    row = (tenant, response.id, response.created_at, prev, conv_id, body, output, expires)
                    seq = await conn.fetchval(self._sql_insert, *row)
                    if seq is None and await conn.fetchval(self._sql_purge, tenant, response.id, now) is not None:
                        seq = await conn.fetchval(self._sql_insert, *row)  # the id was held by an expired row
                    if seq is None:
                        raise Conflict(conflict)
                    if input_items:
                        await conn.execute(self._sql_inputs, tenant, response.id, *in_cols)
                    if next_position is not None and conv_items:
                        first = next_position - len(conv_items)
                        await conn.execute(self._sql_conv_items, tenant, conv_id, first, *conv_cols)
            except pgexc.UniqueViolationError as exc:
                raise Conflict(f"an item id already exists in conversation {conv_id!r}") from exc

        await self._db.run(op if conv_id is not None else put_one)

    async def get(self, tenant: str, response_id: str) -> ResponseRecord:
        validation.check_tenant(tenant)
        validation.check_record_id("response", response_id)

        async def op(conn: Conn) -> asyncpg.Record | None:
            return await conn.fetchrow(self._sql_get, tenant, response_id, self._db.now())

        row = await self._db.run(op)
        if row is None:
            raise NotFound(f"response {response_id!r} not found")
        return ResponseRecord(
            id=response_id,
            created_at=int(row[0]),
            body=codec.loads_object(row[3]),
            output=codec.items_from_array_text(row[4]),
            previous_response_id=row[1],
            conversation_id=row[2],
        )

    async def delete(self, tenant: str, response_id: str) -> None:
        validation.check_tenant(tenant)
        validation.check_record_id("response", response_id)

        async def op(conn: Conn) -> object:
            return await conn.fetchval(self._sql_delete, tenant, response_id, self._db.now())

        if await self._db.run(op) is None:
            raise NotFound(f"response {response_id!r} not found")

    async def list_input_items(
        self,
        tenant: str,
        response_id: str,
        *,
        after: str | None = None,
        limit: int = DEFAULT_PAGE_LIMIT,
        order: Order = "desc",
    ) -> ItemPage:
        validation.check_tenant(tenant)
        validation.check_record_id("response", response_id)
        validation.check_page(limit, order)

        async def op(conn: Conn) -> list[asyncpg.Record]:
            return await _fetch_page(
                conn, self, tenant=tenant, owner_id=response_id, after=after, limit=limit, order=order,
                now=self._db.now(),
                missing=f"response {response_id!r} not found",
                foreign=f"`after` item {after!r} is not an input item of {response_id!r}",
            )  # fmt: skip

        return _page(await self._db.run(op), limit)

    async def load_chain(
        self, tenant: str, response_id: str, *, max_depth: int = DEFAULT_MAX_CHAIN_DEPTH
    ) -> tuple[Item, ...]:
        validation.check_tenant(tenant)
        validation.check_record_id("response", response_id)
        validation.check_depth(max_depth)

        async def op(conn: Conn) -> tuple[list[asyncpg.Record], list[asyncpg.Record]]:
            # One snapshot for both queries, so a concurrent delete cannot split a response from its items.
            async with conn.transaction(isolation="repeatable_read", readonly=True):
                chain = await conn.fetch(self._sql_chain, tenant, response_id, max_depth, self._db.now())
                ids = [r["id"] for r in chain]
                inputs = await conn.fetch(self._sql_chain_inputs, tenant, ids) if chain else []
            return chain, inputs

        chain, inputs = await self._db.run(op)
        if not chain:
            raise NotFound(f"response {response_id!r} not found")
        oldest = chain[0]
        if oldest["previous_response_id"] is not None:
            if oldest["depth"] == max_depth:
                raise InvalidInput(f"previous_response_id chain is deeper than {max_depth}")
            raise NotFound(f"previous response {oldest['previous_response_id']!r} in the chain no longer exists")
        by_response: dict[str, list[Item]] = {}
        for row in inputs:
            by_response.setdefault(row[0], []).append(codec.item_from_text(row[1]))
        items: list[Item] = []
        for row in chain:
            items += by_response.get(row["id"], ())
            items += codec.items_from_array_text(row["output"])
        return tuple(items)


def _conv_items_insert(table: str) -> str:
    return (
        f"INSERT INTO {table} (tenant, conversation_id, position, item_id, type, body)"
        " SELECT $1, $2, $3::bigint + u.ord - 1, u.id, u.type, u.body::jsonb"
        " FROM unnest($4::text[], $5::text[], $6::text[]) WITH ORDINALITY AS u(id, type, body, ord)"
    )


def _conv_bump(table: str) -> str:
    """Reserve $3 item positions in an unexpired conversation ($4 now) and extend its life to $5; returns
    the new next_position, or no row. The UPDATE row-locks the conversation: concurrent appends get
    disjoint positions in commit order."""
    return (
        f"UPDATE {table} SET next_position = next_position + $3, expires_at = $5"
        " WHERE tenant = $1 AND id = $2 AND expires_at > $4 RETURNING next_position"
    )


def _purge(table: str) -> str:
    """Delete the expired (or claimed) row holding id $2 ($3 now), so the id can be reused before the
    sweeper gets to it; its items go with it (ON DELETE CASCADE). Returns 1, or no row."""
    return f"DELETE FROM {table} WHERE tenant = $1 AND id = $2 AND expires_at <= $3 RETURNING 1"


def _one(row: asyncpg.Record | None) -> asyncpg.Record:
    """Unwrap the row of a SELECT without FROM, which always returns exactly one."""
    if row is None:
        raise StorageError("postgres returned no row for a single-row query")
    return row


def _page(rows: list[asyncpg.Record], limit: int) -> ItemPage:
    """Rows were fetched with LIMIT limit+1: the extra row only signals has_more."""
    return ItemPage(tuple(codec.item_from_text(r[0]) for r in rows[:limit]), len(rows) > limit)


class PostgresConversationStore:
    def __init__(self, db: _Database) -> None:
        self._db = db
        t = db
        # Every statement takes now and treats rows with expires_at <= now as absent; every write sets
        # expires_at to now + retention (see the module docstring).
        self._sql_create = (
            f"INSERT INTO {t.conversations} (tenant, id, created_at, metadata, next_position, expires_at)"
            " VALUES ($1, $2, $3, $4::jsonb, $5, $6) ON CONFLICT DO NOTHING RETURNING 1"
        )
        self._sql_purge = _purge(t.conversations)
        self._sql_items = _conv_items_insert(t.items)
        self._sql_get = (
            f"SELECT created_at, metadata::text FROM {t.conversations}"
            " WHERE tenant = $1 AND id = $2 AND expires_at > $3"
        )
        self._sql_update = (
            f"UPDATE {t.conversations} SET metadata = $3::jsonb, expires_at = $5"
            " WHERE tenant = $1 AND id = $2 AND expires_at > $4 RETURNING created_at"
        )
        self._sql_delete = (
            f"DELETE FROM {t.conversations} WHERE tenant = $1 AND id = $2 AND expires_at > $3 RETURNING 1"
        )
        self._sql_bump = _conv_bump(t.conversations)
        self._sql_cursor = (
            f"SELECT EXISTS (SELECT 1 FROM {t.conversations} WHERE tenant = $1 AND id = $2 AND expires_at > $4),"
            f" (SELECT position FROM {t.items} WHERE tenant = $1 AND conversation_id = $2 AND item_id = $3)"
        )
        page = f"SELECT body::text FROM {t.items} WHERE tenant = $1 AND conversation_id = $2"
        self._sql_page_asc = f"{page} AND position > $3::bigint ORDER BY position ASC LIMIT $4"
        self._sql_page_desc = f"{page} AND position < $3::bigint ORDER BY position DESC LIMIT $4"
        self._sql_get_item = (
            f"SELECT EXISTS (SELECT 1 FROM {t.conversations} WHERE tenant = $1 AND id = $2 AND expires_at > $4),"
            f" (SELECT body::text FROM {t.items} WHERE tenant = $1 AND conversation_id = $2 AND item_id = $3)"
        )
        # Deletes the item only from a live conversation (locked, so the sweeper cannot claim it meanwhile)
        # and, if it did, extends the conversation's life like any other write. Returns (conversation
        # live, item deleted).
        self._sql_delete_item = (
            f"WITH live AS (SELECT 1 FROM {t.conversations} WHERE tenant = $1 AND id = $2 AND expires_at > $4"
            " FOR UPDATE),"
            f" d AS (DELETE FROM {t.items} WHERE tenant = $1 AND conversation_id = $2 AND item_id = $3"
            " AND EXISTS (SELECT 1 FROM live) RETURNING 1),"
            f" touch AS (UPDATE {t.conversations} SET expires_at = $5 WHERE tenant = $1 AND id = $2"
            " AND EXISTS (SELECT 1 FROM d))"
            " SELECT EXISTS (SELECT 1 FROM live), EXISTS (SELECT 1 FROM d)"
        )

    def _check(self, tenant: str, conversation_id: str) -> None:
        validation.check_tenant(tenant)
        validation.check_record_id("conversation", conversation_id)

    async def create(self, tenant: str, conversation: Conversation, items: Sequence[Item] = ()) -> Conversation:
        self._check(tenant, conversation.id)
        validation.check_metadata(conversation.metadata)
        validation.check_added_items(items, allow_empty=True)
        meta = codec.dumps(conversation.metadata)
        cols = _item_columns(items)

        async def op(conn: Conn) -> None:
            now, expires = self._db.deadline()
            async with conn.transaction():
                row = (tenant, conversation.id, conversation.created_at, meta, len(items), expires)
                created = await conn.fetchval(self._sql_create, *row)
                if created is None and await conn.fetchval(self._sql_purge, tenant, conversation.id, now) is not None:
                    created = await conn.fetchval(self._sql_create, *row)  # the id was held by an expired row
                if created is None:
                    raise Conflict(f"conversation {conversation.id!r} already exists")
                if items:
                    await conn.execute(self._sql_items, tenant, conversation.id, 0, *cols)

        await self._db.run(op)
        return Conversation(conversation.id, conversation.created_at, dict(conversation.metadata))

    async def get(self, tenant: str, conversation_id: str) -> Conversation:
        self._check(tenant, conversation_id)

        async def op(conn: Conn) -> asyncpg.Record | None:
            return await conn.fetchrow(self._sql_get, tenant, conversation_id, self._db.now())

        row = await self._db.run(op)
        if row is None:
            raise NotFound(f"conversation {conversation_id!r} not found")
        return Conversation(conversation_id, int(row[0]), codec.metadata_from_text(row[1]))

    async def update_metadata(self, tenant: str, conversation_id: str, metadata: Mapping[str, str]) -> Conversation:
        self._check(tenant, conversation_id)
        validation.check_metadata(metadata)
        meta = codec.dumps(metadata)

        async def op(conn: Conn) -> object:
            return await conn.fetchval(self._sql_update, tenant, conversation_id, meta, *self._db.deadline())

        created_at = await self._db.run(op)
        if not isinstance(created_at, int):
            raise NotFound(f"conversation {conversation_id!r} not found")
        return Conversation(conversation_id, created_at, dict(metadata))

    async def delete(self, tenant: str, conversation_id: str) -> None:
        self._check(tenant, conversation_id)

        async def op(conn: Conn) -> object:
            # ON DELETE CASCADE removes the items in the same statement.
            return await conn.fetchval(self._sql_delete, tenant, conversation_id, self._db.now())

        if await self._db.run(op) is None:
            raise NotFound(f"conversation {conversation_id!r} not found")

    async def add_items(self, tenant: str, conversation_id: str, items: Sequence[Item]) -> None:
        self._check(tenant, conversation_id)
        validation.check_added_items(items, allow_empty=False)
        cols = _item_columns(items)

        async def op(conn: Conn) -> None:
            try:
                async with conn.transaction():
                    next_position = await conn.fetchval(
                        self._sql_bump, tenant, conversation_id, len(items), *self._db.deadline()
                    )
                    if next_position is None:
                        raise NotFound(f"conversation {conversation_id!r} not found")
                    first = next_position - len(items)
                    await conn.execute(self._sql_items, tenant, conversation_id, first, *cols)
            except pgexc.UniqueViolationError as exc:
                raise Conflict(f"an item id already exists in conversation {conversation_id!r}") from exc

        await self._db.run(op)

    async def list_items(
        self,
        tenant: str,
        conversation_id: str,
        *,
        after: str | None = None,
        limit: int = DEFAULT_PAGE_LIMIT,
        order: Order = "desc",
    ) -> ItemPage:
        self._check(tenant, conversation_id)
        validation.check_page(limit, order)

        async def op(conn: Conn) -> list[asyncpg.Record]:
            return await _fetch_page(
                conn, self, tenant=tenant, owner_id=conversation_id, after=after, limit=limit, order=order,
                now=self._db.now(),
                missing=f"conversation {conversation_id!r} not found",
                foreign=f"`after` item {after!r} is not in conversation {conversation_id!r}",
            )  # fmt: skip

        return _page(await self._db.run(op), limit)

    async def get_item(self, tenant: str, conversation_id: str, item_id: str) -> Item:
        self._check(tenant, conversation_id)

        async def op(conn: Conn) -> asyncpg.Record | None:
            return await conn.fetchrow(self._sql_get_item, tenant, conversation_id, item_id, self._db.now())

        row = await self._db.run(op)
        if row is None or not row[0]:
            raise NotFound(f"conversation {conversation_id!r} not found")
        if row[1] is None:
            raise NotFound(f"item {item_id!r} not found in conversation {conversation_id!r}")
        return codec.item_from_text(row[1])

    async def delete_item(self, tenant: str, conversation_id: str, item_id: str) -> None:
        self._check(tenant, conversation_id)

        async def op(conn: Conn) -> asyncpg.Record | None:
            return await conn.fetchrow(self._sql_delete_item, tenant, conversation_id, item_id, *self._db.deadline())

        row = await self._db.run(op)
        if row is None or not row[0]:
            raise NotFound(f"conversation {conversation_id!r} not found")
        if not row[1]:
            raise NotFound(f"item {item_id!r} not found in conversation {conversation_id!r}")


def _log_sweeper_death(task: asyncio.Task[None]) -> None:
    """The sweeper only ends by cancellation; anything else is a bug that must not pass silently."""
    if not task.cancelled() and task.exception() is not None:
        _log.error(
            "the retention sweeper died; expired rows stay hidden but are no longer deleted", exc_info=task.exception()
        )


class PostgresKeyStore:
    """API keys in ``{prefix}api_keys`` (storage/keys.py: a stored revocation is never undone)."""

    def __init__(self, db: _Database) -> None:
        self._db = db
        table = f"{db.table_prefix}api_keys"
        self._sql_load = f"SELECT id, body::text, revoked_at FROM {table}"
        # revoked_at: 0 -> the written time; non-zero -> the earliest non-zero time (never back to 0).
        self._sql_put = (
            f"INSERT INTO {table} AS k (id, body, revoked_at)"
            " SELECT * FROM unnest($1::text[], $2::text[]::jsonb[], $3::float8[])"
            " ON CONFLICT (id) DO UPDATE SET body = EXCLUDED.body, updated_at = now(),"
            " revoked_at = CASE WHEN k.revoked_at = 0 THEN EXCLUDED.revoked_at"
            " WHEN EXCLUDED.revoked_at = 0 THEN k.revoked_at ELSE least(k.revoked_at, EXCLUDED.revoked_at) END"
        )

    async def load_keys(self) -> list[StoredKey]:
        async def op(conn: Conn) -> list[StoredKey]:
            rows = await conn.fetch(self._sql_load)
            return [StoredKey(str(r[0]), codec.loads_object(r[1]), float(r[2])) for r in rows]

        return await self._db.run(op)

    async def put_keys(self, keys: Sequence[StoredKey]) -> None:
        latest = {k.key_id: k for k in keys}  # one row per id: ON CONFLICT cannot touch a row twice
        ids = list(latest)
        bodies = [codec.dumps(latest[i].body) for i in ids]
        revoked = [latest[i].revoked_at for i in ids]

        async def op(conn: Conn) -> None:
            await conn.execute(self._sql_put, ids, bodies, revoked)

        if ids:
            await self._db.run(op)


@asynccontextmanager
async def open_postgres_stores(
    config: StorageConfig, *, rng: random.Random | None = None, clock: Callable[[], float] = time.time
) -> AsyncIterator[Stores]:
    """Open the pool, migrate, and start the retention sweeper; leaving the context stops (cancels and
    awaits) the sweeper, then closes the pool. `clock` is wall-clock unix seconds, injectable so tests
    can age rows without sleeping. With postgres_pool_min_size=0 (default) this succeeds while Postgres
    is down and calls raise StorageUnavailable until it is back. Raises StorageUnavailable (pool with
    min_size > 0 cannot connect), MigrationError."""
    try:
        pool = await asyncpg.create_pool(
            config.postgres_url,
            min_size=config.postgres_pool_min_size,
            max_size=config.postgres_pool_max_size,
            timeout=config.connect_timeout_s,
            command_timeout=config.command_timeout_s,
            # Names the deployment in pg_stat_activity (and lets tests target exactly this pool).
            server_settings={"application_name": f"smg-node-storage:{config.table_prefix}"},
        )
    except _UNAVAILABLE as exc:
        raise StorageUnavailable(f"postgres unavailable: {exc!r}") from exc
    try:
        db = _Database(pool, config, rng or random.Random(), clock)
        try:
            await db.ensure_schema()
        except StorageUnavailable as exc:
            _log.warning("postgres unavailable at start; migrating on first use: %s", exc)
        sweeper = asyncio.create_task(
            sweep_periodically(db.sweep, interval_s=config.postgres_sweep_interval_s),
            name=f"postgres-retention-sweep:{config.table_prefix}",
        )
        sweeper.add_done_callback(_log_sweeper_death)
        try:
            yield Stores(PostgresResponseStore(db), PostgresConversationStore(db), PostgresKeyStore(db))
        finally:
            sweeper.cancel()
            await asyncio.gather(sweeper, return_exceptions=True)
    finally:
        try:
            await asyncio.wait_for(pool.close(), timeout=config.connect_timeout_s + config.command_timeout_s)
        except TimeoutError:
            pool.terminate()  # connections still busy or the server unreachable: drop the sockets
