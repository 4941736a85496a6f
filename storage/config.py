"""StorageConfig: the one typed config of the history store. Defaults live here and nowhere else.

A generic loader turns each field into a CLI flag (metadata "flag") with "help" as its text.
"""

import re
from dataclasses import dataclass, field, fields
from typing import Literal

Backend = Literal["memory", "redis", "postgres"]
BACKENDS: tuple[Backend, ...] = ("memory", "redis", "postgres")

# Interpolated into SQL identifiers, so only a safe identifier alphabet; 40 chars leaves room for the
# longest table name under Postgres' 63-byte identifier limit.
_TABLE_PREFIX_RE = re.compile(r"[a-z_][a-z0-9_]{0,39}")
# The first segment of every Redis key; ':' is the separator so it may not appear inside.
_KEY_PREFIX_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
# Longer than any deployment lives; keeps every deadline inside each backend's time range (Python datetime
# and Postgres timestamptz for postgres, PEXPIRE milliseconds for redis). Also rejects inf.
MAX_RETENTION_S = 100 * 365 * 24 * 3600.0


@dataclass(frozen=True, slots=True)
class StorageConfig:
    backend: Backend = field(
        default="memory",
        metadata={
            "flag": "--history-backend",
            "help": "Where Responses/Conversations history lives: memory (per node, lost on restart), "
            "redis or postgres (shared by all nodes).",
        },
    )
    postgres_url: str = field(
        default="postgresql://postgres@127.0.0.1:5432/postgres",
        repr=False,  # may carry a password
        metadata={"flag": "--postgres-url", "help": "asyncpg DSN for the postgres backend."},
    )
    redis_url: str = field(
        default="redis://127.0.0.1:6379/0",
        repr=False,  # may carry a password
        metadata={"flag": "--redis-url", "help": "Redis URL for the redis backend."},
    )
    table_prefix: str = field(
        default="smg_",
        metadata={
            "flag": "--history-table-prefix",
            "help": "Prefix of every Postgres table (lets several deployments share one database).",
        },
    )
    key_prefix: str = field(
        default="smg",
        metadata={"flag": "--history-key-prefix", "help": "First segment of every Redis key."},
    )
    retention_s: float = field(
        default=30 * 24 * 3600.0,
        metadata={
            "flag": "--history-retention-s",
            "help": "Seconds a response or conversation (with its items) is kept after its last write; reads "
            "do not extend it. Every backend hides an expired entry at once; memory drops it, redis lets its "
            "keys' TTL lapse, postgres deletes its rows in a background sweep. At most 100 years.",
        },
    )
    postgres_sweep_interval_s: float = field(
        default=60.0,
        metadata={
            "flag": "--history-postgres-sweep-interval-s",
            "help": "postgres: period of the background sweep that deletes expired rows in small batches "
            "(reads skip expired rows before that; the sweep only reclaims space).",
        },
    )
    memory_max_items: int = field(
        default=100_000,
        metadata={
            "flag": "--history-memory-max-items",
            "help": "memory: capacity in items (each response/conversation counts 1 plus its items); "
            "least recently used ones are evicted beyond it.",
        },
    )
    postgres_pool_min_size: int = field(
        default=0,
        metadata={
            "flag": "--history-postgres-pool-min-size",
            "help": "Connections opened eagerly (0 lets the node start while Postgres is down).",
        },
    )
    postgres_pool_max_size: int = field(
        default=20, metadata={"flag": "--history-postgres-pool-max-size", "help": "Max Postgres connections."}
    )
    redis_max_connections: int = field(
        default=64, metadata={"flag": "--history-redis-max-connections", "help": "Max Redis connections."}
    )
    connect_timeout_s: float = field(
        default=1.5,
        metadata={
            "flag": "--history-connect-timeout-s",
            "help": "Bound on opening a connection (and on waiting for a free pooled one); past it a "
            "call fails with StorageUnavailable instead of hanging.",
        },
    )
    command_timeout_s: float = field(
        default=2.0,
        metadata={"flag": "--history-command-timeout-s", "help": "Bound on one command/query round trip."},
    )
    migration_timeout_s: float = field(
        default=60.0,
        metadata={
            "flag": "--history-migration-timeout-s",
            "help": "postgres: bound on waiting for the migration lock and applying migrations at start.",
        },
    )

    def __post_init__(self) -> None:
        """Raises ValueError naming the offending field."""
        if self.backend not in BACKENDS:
            raise ValueError(f"backend: expected one of {BACKENDS}, got {self.backend!r}")
        if not _TABLE_PREFIX_RE.fullmatch(self.table_prefix):
            raise ValueError(f"table_prefix: must match {_TABLE_PREFIX_RE.pattern}: {self.table_prefix!r}")
        if not _KEY_PREFIX_RE.fullmatch(self.key_prefix):
            raise ValueError(f"key_prefix: must match {_KEY_PREFIX_RE.pattern}, got {self.key_prefix!r}")
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name.endswith("_s") and not value > 0:
                raise ValueError(f"{f.name}: must be > 0, got {value!r}")
        if self.retention_s > MAX_RETENTION_S:
            raise ValueError(f"retention_s: must be <= {MAX_RETENTION_S:.0f} (100 years), got {self.retention_s!r}")
        if self.memory_max_items < 1:
            raise ValueError(f"memory_max_items: must be >= 1, got {self.memory_max_items}")
        if self.postgres_pool_min_size < 0:
            raise ValueError(f"postgres_pool_min_size: must be >= 0, got {self.postgres_pool_min_size}")
        if self.postgres_pool_max_size < max(1, self.postgres_pool_min_size):
            raise ValueError("postgres_pool_max_size: must be >= 1 and >= postgres_pool_min_size")
        if self.redis_max_connections < 1:
            raise ValueError(f"redis_max_connections: must be >= 1, got {self.redis_max_connections}")
