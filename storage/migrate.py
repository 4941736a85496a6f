"""Forward-only, versioned schema migrations for the Postgres backend.

Files `migrations/NNNN_name.sql` are applied in version order, each in its own transaction together with
its row in `{prefix}schema_migrations` (version, name, sha256 of the file), so a crash leaves the schema
at a recorded version. The whole run holds a session advisory lock derived from the table prefix:
nodes starting together queue on it, and each finds the work already done by the first. Deployments
with different prefixes in one database do not block each other.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from storage.errors import MigrationError

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
_FILE_RE = re.compile(r"(\d{4})_([a-z0-9_]+)\.sql")


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql_template: str
    checksum: str

    def sql(self, table_prefix: str) -> str:
        # table_prefix is validated by StorageConfig to an identifier alphabet, so plain substitution is safe.
        return self.sql_template.replace("{prefix}", table_prefix)


def load_migrations(directory: Path = MIGRATIONS_DIR) -> tuple[Migration, ...]:
    """Raises MigrationError unless the files are numbered 1, 2, 3, ... without gaps or duplicates."""
    found: list[Migration] = []
    for path in sorted(directory.glob("*.sql")):
        match = _FILE_RE.fullmatch(path.name)
        if match is None:
            raise MigrationError(f"migration file {path.name!r} is not named NNNN_name.sql")
        text = path.read_text(encoding="utf-8")
        found.append(Migration(int(match[1]), match[2], text, hashlib.sha256(text.encode()).hexdigest()))
    if [m.version for m in found] != list(range(1, len(found) + 1)):
        raise MigrationError(f"migration versions must be 1..n without gaps: {[m.version for m in found]}")
    return tuple(found)


def lock_key(table_prefix: str, purpose: str = "migrations") -> int:
    """The advisory lock id (a signed 64-bit int) guarding one `purpose` (migrations, the retention
    sweep) of one table prefix."""
    digest = hashlib.blake2b(f"smg-storage-{purpose}:{table_prefix}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


async def migrate(
    conn: asyncpg.Connection[asyncpg.Record] | asyncpg.pool.PoolConnectionProxy[asyncpg.Record],
    table_prefix: str,
    *,
    timeout_s: float,
    migrations: tuple[Migration, ...] | None = None,
) -> list[int]:
    """Apply pending migrations on `conn`; returns the versions applied by this call.

    `timeout_s` bounds each statement, including the wait for the lock. Raises MigrationError if an
    applied migration's checksum differs from its file; asyncpg/OS errors propagate to the caller.
    """
    pending = load_migrations() if migrations is None else migrations
    key = lock_key(table_prefix)
    table = f"{table_prefix}schema_migrations"
    await conn.execute("SELECT pg_advisory_lock($1)", key, timeout=timeout_s)
    try:
        await conn.execute(
            f"CREATE TABLE IF NOT EXISTS {table} (version integer PRIMARY KEY, name text NOT NULL,"
            " checksum text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())",
            timeout=timeout_s,
        )
        rows = await conn.fetch(f"SELECT version, checksum FROM {table}", timeout=timeout_s)
        applied = {int(r["version"]): str(r["checksum"]) for r in rows}
        done: list[int] = []
        for m in pending:
            if m.version in applied:
                if applied[m.version] != m.checksum:
                    raise MigrationError(f"migration {m.version:04d}_{m.name} was edited after it was applied")
                continue
            async with conn.transaction():
                await conn.execute(m.sql(table_prefix), timeout=timeout_s)
                await conn.execute(
                    f"INSERT INTO {table} (version, name, checksum) VALUES ($1, $2, $3)",
                    m.version,
                    m.name,
                    m.checksum,
                    timeout=timeout_s,
                )
            done.append(m.version)
        # Versions above ours come from newer nodes; they are tolerated because migrations must be additive.
        return done
    finally:
        # A pooled connection's reset also runs pg_advisory_unlock_all(), and a lost session drops its
        # locks, so the lock cannot outlive this run even if the unlock below never executes.
        if not conn.is_closed():
            await conn.execute("SELECT pg_advisory_unlock($1)", key, timeout=timeout_s)
