"""Server-streaming gRPC calls (Generate) over our own HTTP/2 connection, without grpc.aio.

Why: grpc.aio spends ~25-40 µs of CPU per received message (a batch op, a future, a wake-up byte through its
poller thread, a resume on the loop) and delivers at most one message per loop iteration; frames parsed in
``data_received`` cost a third of that and hand a reader every message that arrived together (bench/RESULTS.md,
"Streaming CPU per request"). Unary RPCs stay on grpc.aio.

A thin asyncio shell around the sans-IO ``H2Connection``: one connection per worker, multiplexing every call
(like a gRPC channel), opened on first use and again after it was lost or the worker sent GOAWAY (streams
already running on the old one finish there). Calls beyond the worker's SETTINGS_MAX_CONCURRENT_STREAMS wait
for a free stream. Failures are ``CallFailed`` with a gRPC status; the caller maps them to its own errors.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncGenerator, Sequence

import hpack

from node.workers.grpc_wire import UNAVAILABLE, GrpcStatus, encode_message, request_headers
from node.workers.h2_connection import H2Connection, Stream

#: A call the worker refused before processing it (REFUSED_STREAM, GOAWAY) is sent again at most this often,
#: as grpc's transparent retry does: servers count streams as busy a little longer than the client can see.
MAX_UNPROCESSED_RETRIES = 10
#: A worker that does not accept the TCP connection and send its SETTINGS within this long is unavailable.
CONNECT_TIMEOUT_S = 5.0


class CallFailed(Exception):
    """A call ended with a non-OK gRPC status (connection failures are UNAVAILABLE)."""

    def __init__(self, status: GrpcStatus) -> None:
        super().__init__(f"{status.name}: {status.message}")
        self.status = status


class _Protocol(asyncio.Protocol):
    """Feeds the socket to the core, writes what it answers and wakes the readers of the streams it changed."""

    def __init__(self, core: H2Connection, on_stream_freed: collections.abc.Callable[[], None]) -> None:
        self.core = core
        self.waiters: dict[int, asyncio.Future[None]] = {}
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._on_stream_freed = on_stream_freed
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's TCPTransport is not registered
        self.core.initiate()
        self.flush()

    def data_received(self, data: bytes) -> None:
        changed = self.core.receive_data(data)
        self.flush()
        if self.core.ready and not self.ready.done():
            self.ready.set_result(None)
        self._wake(changed)
        if self.core.closed is not None:
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        reason = f"connection to the worker lost: {exc}" if exc is not None else "the worker closed the connection"
        changed = self.core.connection_lost(reason)
        if not self.ready.done():
            self.ready.set_exception(CallFailed(GrpcStatus(UNAVAILABLE, reason)))
            self.ready.exception()  # retrieved: nobody may be waiting for it any more
        self._wake(changed)
        for waiter in self.waiters.values():
            if not waiter.done():
                waiter.set_result(None)
        self._on_stream_freed()

    def _wake(self, changed: list[Stream]) -> None:
        freed = False
        for stream in changed:
            waiter = self.waiters.pop(stream.id, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
            freed = freed or stream.ended
        if freed:
            self._on_stream_freed()

    def flush(self) -> None:
        out = self.core.data_to_send()
        if out and self._transport is not None:
            self._transport.write(out)

    def close_if_idle(self) -> None:
        """A connection that takes no new calls closes once its last stream ended."""
        if not self.core.accepting and self.core.active == 0:
            self.close()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


class H2GenerateChannel:
    """Server-streaming calls with one request message to ``host:port``, over one multiplexed connection."""

    def __init__(self, target: str, *, max_message_bytes: int, connect_timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        host, _, port = target.rpartition(":")
        self._host = host.strip("[]")
        self._port = int(port)
        self._authority = target
        self._max_message_bytes = max_message_bytes
        self._connect_timeout_s = connect_timeout_s
        self._current: _Protocol | None = None
        self._all: set[_Protocol] = set()
        self._lock = asyncio.Lock()
        self._openers: collections.deque[asyncio.Future[None]] = collections.deque()
        self._header_blocks: dict[str, bytes] = {}
        self._closed = False

    async def call(
        self, path: str, message: bytes, *, metadata: Sequence[tuple[str, str]] = ()
    ) -> AsyncGenerator[list[bytes], None]:
        """Yield the response messages of one call, every message that arrived together as one list;
        ``metadata`` are extra request headers (lower-case names, e.g. traceparent).

        Raises CallFailed when the call ends with a non-OK status, after yielding what arrived before it.
        Closing the generator early resets the stream (RST_STREAM CANCEL).
        """
        loop = asyncio.get_running_loop()
        body = encode_message(message)
        headers = self._header_block(path)
        if metadata:
            # Never-indexed literals touch no dynamic table, so a second block appends to the cached one.
            headers += hpack.Encoder().encode([hpack.NeverIndexedHeaderTuple(k, v) for k, v in metadata])
        conn = await self._open_slot(wait=False)
        stream = conn.core.open_stream(headers, body)
        conn.flush()
        retries = 0
        try:
            while True:
                if stream.messages:
                    batch = stream.messages
                    stream.messages = []
                    yield batch
                elif stream.ended and stream.unprocessed and retries < MAX_UNPROCESSED_RETRIES:
                    retries += 1
                    # Wait until a stream the worker does count ends (if any), then send the call again.
                    conn = await self._open_slot(wait=conn.core.active > 0)
                    stream = conn.core.open_stream(headers, body)
                    conn.flush()
                elif stream.ended:
                    status = stream.status
                    if status is not None and status.code != 0:
                        raise CallFailed(status)
                    return
                else:
                    waiter = conn.waiters[stream.id] = loop.create_future()
                    await waiter
        finally:
            if not stream.ended:
                conn.waiters.pop(stream.id, None)
                conn.core.cancel_stream(stream)
                conn.flush()
                self._stream_freed()
            conn.close_if_idle()

    async def close(self) -> None:
        """Close every connection; calls still running fail UNAVAILABLE."""
        self._closed = True
        for conn in list(self._all):
            conn.close()
        self._current = None

    def _header_block(self, path: str) -> bytes:
        block = self._header_blocks.get(path)
        if block is None:
            # Never-indexed literals: the block uses no dynamic-table state, so one encoding serves every call.
            fields = [hpack.NeverIndexedHeaderTuple(k, v) for k, v in request_headers(self._authority, path)]
            block = self._header_blocks[path] = hpack.Encoder().encode(fields)
        return block

    async def _open_slot(self, *, wait: bool) -> _Protocol:
        """A connection with a free stream, waiting for one when the worker's stream limit is reached (and
        for a stream to end first, with ``wait``).

        Raises CallFailed(UNAVAILABLE) when the worker cannot be connected to.
        """
        while True:
            conn = self._current
            if conn is None or not conn.core.accepting:
                conn = await self._connect()
            if conn.core.can_open() and not self._openers and not wait:
                return conn
            wait = False
            if conn.core.can_open():  # first come, first served: let the queued ones go first
                self._stream_freed()
            waiter = asyncio.get_running_loop().create_future()
            self._openers.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._stream_freed()  # woken but leaving: pass the free stream on
                raise
            finally:
                with contextlib.suppress(ValueError):
                    self._openers.remove(waiter)
            conn = self._current
            if conn is not None and conn.core.can_open():
                return conn

    def _stream_freed(self) -> None:
        conn = self._current
        free = 1 if conn is None else max(1, conn.core.free_streams)
        while self._openers and free > 0:
            waiter = self._openers.popleft()
            if not waiter.done():
                waiter.set_result(None)
                free -= 1

    async def _connect(self) -> _Protocol:
        async with self._lock:
            conn = self._current
            if conn is not None and conn.core.accepting:
                return conn
            if self._closed:
                raise CallFailed(GrpcStatus(UNAVAILABLE, "the channel is closed"))
            if conn is not None:
                conn.close_if_idle()  # draining: streams still running there finish first
            loop = asyncio.get_running_loop()
            core = H2Connection(self._max_message_bytes)
            protocol: _Protocol | None = None
            try:
                async with asyncio.timeout(self._connect_timeout_s):
                    _, protocol = await loop.create_connection(
                        lambda: _Protocol(core, self._stream_freed), self._host, self._port
                    )
                    await protocol.ready
            except (OSError, TimeoutError, CallFailed) as exc:
                if protocol is not None:
                    protocol.close()
                detail = exc.status.message if isinstance(exc, CallFailed) else str(exc) or type(exc).__name__
                raise CallFailed(GrpcStatus(UNAVAILABLE, f"failed to connect to {self._authority}: {detail}")) from exc
            self._all.add(protocol)
            self._all = {p for p in self._all if p.core.closed is None}
            self._current = protocol
            return protocol
