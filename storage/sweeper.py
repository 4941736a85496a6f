"""The Postgres retention sweeper: deletes responses and conversations whose `expires_at` has passed.

Reads already skip expired rows (storage/postgres.py), so the sweep only reclaims space: running it late,
twice, or on several nodes at once changes nothing a client can see. It never holds locks for long: every
statement touches at most `batch_rows` rows, counting what ON DELETE CASCADE removes, and commits on its
own. Per owner table (responses with their input items, conversations with their items) a round is:

1. claim up to `batch_rows` expired owners by setting their expires_at to '-infinity', skipping rows a
   writer holds. An owner's items may not fit in one bounded statement, so the owner must stay dead
   between the batches that delete them: '-infinity' is below every clock, so no node, not even one whose
   clock lags the sweeper's, reads or refreshes a claimed owner again.
2. delete the items of claimed owners, `batch_rows` at a time;
3. delete claimed owners that have no items left (their cascade is empty), `batch_rows` at a time.

Rounds repeat until a claim finds fewer than `batch_rows` owners. Claims left by a sweep that died midway
are finished by the next one.

Several sweepers at once are harmless: claims and deletes skip rows another one holds, and a row deleted
twice is deleted once, so every row is counted by exactly one sweeper. `sweep_if_free` also takes a
non-blocking advisory lock per table prefix, so usually one node sweeps and the others skip the round.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TypeAlias

import asyncpg

from storage.errors import StorageError

_log = logging.getLogger(__name__)

# Rows per statement. Items are small JSON documents, so a batch takes milliseconds, well inside the
# command timeout, and its row locks are never held long enough to stall a request.
SWEEP_BATCH_ROWS = 500

AnyConn: TypeAlias = "asyncpg.Connection[asyncpg.Record] | asyncpg.pool.PoolConnectionProxy[asyncpg.Record]"


@dataclass(frozen=True, slots=True)
class OwnedTable:
    """A table of expiring rows (`owners`, keyed by tenant and id) and the table of their items
    (`children`, referencing them through (tenant, `owner_column`) with ON DELETE CASCADE)."""

    owners: str
    children: str
    owner_column: str

    @property
    def claim_sql(self) -> str:
        """$1 now, $2 batch size; returns the number of owners claimed."""
        return (
            f"WITH c AS (UPDATE {self.owners} SET expires_at = '-infinity' WHERE (tenant, id) IN"
            f" (SELECT tenant, id FROM {self.owners} WHERE expires_at > '-infinity' AND expires_at <= $1"
            " LIMIT $2 FOR UPDATE SKIP LOCKED) RETURNING 1)"
            " SELECT count(*) FROM c"
        )

    @property
    def delete_children_sql(self) -> str:
        """$1 batch size; returns the number of items deleted. Items are never updated, so their ctid is a
        stable handle for the statement's duration."""
        return (
            f"WITH d AS (DELETE FROM {self.children} WHERE ctid = ANY(ARRAY("
            f"SELECT i.ctid FROM {self.owners} o JOIN {self.children} i"
            f" ON i.tenant = o.tenant AND i.{self.owner_column} = o.id"
            " WHERE o.expires_at = '-infinity' LIMIT $1 FOR UPDATE OF i SKIP LOCKED)) RETURNING 1)"
            " SELECT count(*) FROM d"
        )

    @property
    def delete_owners_sql(self) -> str:
        """$1 batch size; returns the number of owners deleted."""
        return (
            f"WITH d AS (DELETE FROM {self.owners} WHERE (tenant, id) IN"
            f" (SELECT o.tenant, o.id FROM {self.owners} o WHERE o.expires_at = '-infinity'"
            f" AND NOT EXISTS (SELECT 1 FROM {self.children} i"
            f" WHERE i.tenant = o.tenant AND i.{self.owner_column} = o.id)"
            " LIMIT $1 FOR UPDATE SKIP LOCKED) RETURNING 1)"
            " SELECT count(*) FROM d"
        )


async def _count(conn: AnyConn, sql: str, *args: object) -> int:
    value = await conn.fetchval(sql, *args)
    return int(value or 0)


async def _drain(conn: AnyConn, sql: str, batch_rows: int) -> int:
    """Run a batch statement until it affects fewer than `batch_rows` rows; returns the total."""
    total = 0
    while True:
        n = await _count(conn, sql, batch_rows)
        total += n
        if n < batch_rows:
            return total


async def sweep_expired(
    conn: AnyConn, tables: Sequence[OwnedTable], *, now: datetime, batch_rows: int = SWEEP_BATCH_ROWS
) -> int:
    """Delete every owner that expired at or before `now`, with its items, in bounded batches (see the
    module docstring). Returns the number of rows deleted (owners and items). Raises what asyncpg
    raises; a sweep cut short leaves claims that the next sweep finishes."""
    deleted = 0
    for table in tables:
        while True:
            claimed = await _count(conn, table.claim_sql, now, batch_rows)
            deleted += await _drain(conn, table.delete_children_sql, batch_rows)
            deleted += await _drain(conn, table.delete_owners_sql, batch_rows)
            if claimed < batch_rows:
                break
    return deleted


async def sweep_if_free(
    conn: AnyConn,
    tables: Sequence[OwnedTable],
    *,
    lock_key: int,
    now: datetime,
    batch_rows: int = SWEEP_BATCH_ROWS,
) -> int | None:
    """`sweep_expired` under the session advisory lock `lock_key`, or None at once if another session
    holds it. The lock is released on success; after an error the pool's reset on release
    (pg_advisory_unlock_all) or the session's end drops it. Raises what asyncpg raises."""
    if not await conn.fetchval("SELECT pg_try_advisory_lock($1)", lock_key):
        return None
    deleted = await sweep_expired(conn, tables, now=now, batch_rows=batch_rows)
    await conn.execute("SELECT pg_advisory_unlock($1)", lock_key)
    return deleted


async def sweep_periodically(sweep: Callable[[], Awaitable[int | None]], *, interval_s: float) -> None:
    """Call `sweep` every `interval_s`, forever; the first call comes one interval after the start, so
    opening a store stays cheap. A StorageError is logged and the sweep tried again next interval; an
    outage therefore only delays reclaiming space."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            deleted = await sweep()
        except StorageError as exc:
            _log.warning("retention sweep failed, next try in %.0f s: %s", interval_s, exc)
            continue
        if deleted is None:
            _log.debug("retention sweep skipped: another node is sweeping")
        elif deleted:
            _log.debug("retention sweep deleted %d expired rows", deleted)
