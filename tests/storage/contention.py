"""Real, lasting write contention on one Postgres row, for tests of what happens when retries run out."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import asyncpg

# How long the helper holds the row between commits: each of the store's attempts waits at most this long.
CHURN_PERIOD_S = 0.02


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


@contextlib.asynccontextmanager
async def churned_conversation(url: str, table_prefix: str, tenant: str, conversation_id: str) -> AsyncIterator[None]:
    """Keep a conversation row updated by an open transaction of a helper connection that, every
    CHURN_PERIOD_S, commits and updates the row again in the same message: the row is unlocked only for
    microseconds inside the server. A REPEATABLE READ or SERIALIZABLE transaction that updates the row
    meanwhile waits for the helper's lock, then fails with 40001 when the helper commits."""
    update = (
        f"UPDATE {table_prefix}conversations SET metadata = metadata"
        f" WHERE tenant = {_literal(tenant)} AND id = {_literal(conversation_id)}"
    )
    conn = await asyncpg.connect(url)
    stop = asyncio.Event()

    async def churn() -> None:
        while not stop.is_set():
            await asyncio.sleep(CHURN_PERIOD_S)
            await conn.execute(f"COMMIT; BEGIN; {update}")  # one simple-query message: no gap for others

    try:
        await conn.execute(f"BEGIN; {update}")
        task = asyncio.create_task(churn())
        try:
            yield
        finally:
            stop.set()
            await task
            await conn.execute("ROLLBACK")
    finally:
        await conn.close()
