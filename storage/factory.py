"""open_stores(): the one place that turns a StorageConfig into live stores.

The composition root enters it on its AsyncExitStack; leaving the context stops the backend's background
task (the Postgres retention sweeper), then closes pools and clients.
Backend modules are imported lazily so a memory-only node never loads asyncpg or redis.
"""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from storage.base import Stores
from storage.config import StorageConfig


@asynccontextmanager
async def open_stores(config: StorageConfig) -> AsyncIterator[Stores]:
    """Yield both stores over the configured backend.

    Redis and Postgres (with the default pool min size 0) open even while their server is down; calls
    then raise StorageUnavailable until it returns. Raises MigrationError (postgres schema cannot be
    brought up to date), StorageUnavailable (postgres pool with a min size cannot connect).
    """
    if config.backend == "memory":
        from storage.memory import memory_stores

        yield memory_stores(max_items=config.memory_max_items, retention_s=config.retention_s)
    elif config.backend == "redis":
        from storage.redis import open_redis_stores

        async with open_redis_stores(config) as stores:
            yield stores
    else:
        from storage.postgres import open_postgres_stores

        async with open_postgres_stores(config) as stores:
            yield stores
