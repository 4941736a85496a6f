"""Fixtures for the storage tests: real Postgres and Redis on 127.0.0.1, started here if they are down.

Each session uses its own table prefix and key prefix and every test its own tenant, so concurrent runs
never collide; the session removes its tables and keys at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest
import redis.asyncio as aioredis

from storage import StorageConfig, Stores, open_stores
from storage.config import BACKENDS
from storage.memory import memory_stores
from storage.postgres import open_postgres_stores

PG_HOST, PG_PORT, REDIS_PORT = "127.0.0.1", 5432, 6379
PG_URL = f"postgresql://postgres@{PG_HOST}:{PG_PORT}/test"
REDIS_URL = f"redis://{PG_HOST}:{REDIS_PORT}/0"
SERVICE_START_TIMEOUT_S = 20.0


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
        return True
    return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_for_port(port: int, timeout_s: float = SERVICE_START_TIMEOUT_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if port_open(port):
            return True
        time.sleep(0.1)
    return False


def _ensure_service(name: str, port: int, command: list[str]) -> None:
    if port_open(port):
        return
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if not wait_for_port(port):
        pytest.fail(
            f"{name} is not listening on 127.0.0.1:{port} and starting it failed.\n"
            f"command: {' '.join(command)}\nexit: {result.returncode}\n{result.stdout}{result.stderr}",
            pytrace=False,
        )


def _pg_start_command() -> list[str]:
    versions = sorted(p.name for p in Path("/etc/postgresql").glob("*"))
    version = versions[-1] if versions else "15"
    return ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "start"]


@pytest.fixture(scope="session")
def postgres_url() -> str:
    _ensure_service("Postgres", PG_PORT, _pg_start_command())
    return PG_URL


REDIS_START = "redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save '' --appendonly no"


@pytest.fixture(scope="session")
def redis_url() -> str:
    _ensure_service("Redis", REDIS_PORT, shlex.split(REDIS_START))
    return REDIS_URL


async def drop_tables(url: str, table_prefix: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        names = await conn.fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() AND starts_with(tablename, $1)",
            table_prefix,
        )
        for row in names:
            await conn.execute(f'DROP TABLE IF EXISTS "{row[0]}" CASCADE')
    finally:
        await conn.close()


async def delete_keys(url: str, key_prefix: str) -> None:
    client = aioredis.Redis.from_url(url)
    try:
        keys = [k async for k in client.scan_iter(match=f"{key_prefix}:*", count=1000)]
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()


@pytest.fixture(scope="session")
def table_prefix(postgres_url: str) -> Iterator[str]:
    prefix = f"t{uuid.uuid4().hex[:10]}_"
    yield prefix
    asyncio.run(drop_tables(postgres_url, prefix))


@pytest.fixture(scope="session")
def key_prefix(redis_url: str) -> Iterator[str]:
    prefix = f"t{uuid.uuid4().hex[:10]}"
    yield prefix
    asyncio.run(delete_keys(redis_url, prefix))


@pytest.fixture
def tenant() -> str:
    return f"tenant-{uuid.uuid4().hex[:12]}"


def backend_config(request: pytest.FixtureRequest, backend: str, **overrides: object) -> StorageConfig:
    """A config for `backend` on this session's prefixes (fixtures resolved only for that backend)."""
    base: dict[str, object] = {"backend": backend}
    if backend == "postgres":
        base["postgres_url"] = request.getfixturevalue("postgres_url")
        base["table_prefix"] = request.getfixturevalue("table_prefix")
    elif backend == "redis":
        base["redis_url"] = request.getfixturevalue("redis_url")
        base["key_prefix"] = request.getfixturevalue("key_prefix")
    return StorageConfig(**(base | overrides))  # type: ignore[arg-type]


@pytest.fixture(params=BACKENDS)
async def stores(request: pytest.FixtureRequest) -> AsyncIterator[Stores]:
    async with open_stores(backend_config(request, request.param)) as opened:
        yield opened


class FakeClock:
    """A wall clock (unix seconds) that moves only when a test moves it."""

    def __init__(self) -> None:
        self.now_s = time.time()

    def __call__(self) -> float:
        return self.now_s


# Short enough for Redis, whose TTLs run on the server's real clock; the fake clocks do not care.
AGING_RETENTION_S = 1.5


@dataclass(frozen=True)
class Aging:
    """Stores with a short retention and a way to let time pass: a fake clock for memory and postgres,
    real sleeps for redis."""

    stores: Stores
    retention_s: float
    advance: Callable[[float], Awaitable[None]]


@pytest.fixture(params=BACKENDS)
async def aging(request: pytest.FixtureRequest) -> AsyncIterator[Aging]:
    config = backend_config(request, request.param, retention_s=AGING_RETENTION_S)
    if request.param == "redis":
        async with open_stores(config) as opened:
            yield Aging(opened, config.retention_s, asyncio.sleep)
        return
    clock = FakeClock()

    async def advance(seconds: float) -> None:
        clock.now_s += seconds

    if request.param == "memory":
        yield Aging(
            memory_stores(max_items=100, retention_s=config.retention_s, clock=clock), config.retention_s, advance
        )
    else:
        async with open_postgres_stores(config, clock=clock) as opened:
            yield Aging(opened, config.retention_s, advance)


class TcpProxy:
    """A TCP forwarder to 127.0.0.1:`upstream_port` that a test can stop (refusing new connections and
    cutting open ones, like a server crash) and start again on the same port. With `blackhole=True` it
    accepts connections and never answers, like a hung server or a dropped route."""

    def __init__(self, upstream_port: int, *, blackhole: bool = False) -> None:
        self.port = free_port()
        self._upstream_port = upstream_port
        self._blackhole = blackhole
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for writer in self._writers:
            writer.close()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        self._writers.clear()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self._writers.add(writer)
        try:
            if self._blackhole:
                await reader.read()  # until the client gives up or stop() cuts the connection
                return
            try:
                up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._upstream_port)
            except OSError:
                return
            self._writers.add(up_writer)
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except ConnectionError:
            pass
        finally:
            writer.close()
            self._handlers.discard(task)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


@pytest.fixture
async def tcp_proxy() -> AsyncIterator[Callable[..., Awaitable[TcpProxy]]]:
    """Factory of started TcpProxy instances, all stopped at teardown."""
    proxies: list[TcpProxy] = []

    async def make(upstream_port: int, *, blackhole: bool = False) -> TcpProxy:
        proxy = TcpProxy(upstream_port, blackhole=blackhole)
        await proxy.start()
        proxies.append(proxy)
        return proxy

    yield make
    for proxy in proxies:
        await proxy.stop()


@pytest.fixture
def fresh_key_prefix(redis_url: str) -> Iterator[str]:
    """A key prefix of this test alone, for tests that inspect the whole key space under it."""
    prefix = f"t{uuid.uuid4().hex[:10]}"
    yield prefix
    asyncio.run(delete_keys(redis_url, prefix))


@pytest.fixture
async def fresh_table_prefix(postgres_url: str) -> AsyncIterator[str]:
    """A table prefix of this test alone (an unmigrated schema)."""
    prefix = f"t{uuid.uuid4().hex[:10]}_"
    yield prefix
    await drop_tables(postgres_url, prefix)


class RedisServer:
    """A private redis-server on a spare port, owned by one test, that it may shut down and restart."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self._workdir = workdir
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        command = shlex.split(f"redis-server --port {self.port} --bind 127.0.0.1 --save '' --appendonly no")
        self._proc = subprocess.Popen(
            [*command, "--dir", str(self._workdir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        if not wait_for_port(self.port, timeout_s=10):
            raise RuntimeError(f"redis-server did not start on port {self.port}")

    def shutdown(self) -> None:
        """Graceful stop via `redis-cli shutdown nosave`: the data is gone."""
        subprocess.run(["redis-cli", "-p", str(self.port), "shutdown", "nosave"], capture_output=True, check=False)
        if self._proc is not None:
            self._proc.wait(timeout=10)
            self._proc = None

    def kill(self) -> None:
        """A crash: SIGKILL."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait(timeout=10)
            self._proc = None


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    if subprocess.run(["which", "redis-server"], capture_output=True, check=False).returncode != 0:
        pytest.fail("redis-server is not installed; the Redis outage test needs it", pytrace=False)
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.kill()
