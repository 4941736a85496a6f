"""gRPC calls (Generate, and the health checks' unary calls) over our own HTTP/2 connection, without grpc.aio.

Why: grpc.aio spends ~25-40 µs of CPU per received message (a batch op, a future, a wake-up byte through its
poller thread, a resume on the loop) and delivers at most one message per loop iteration; frames parsed in
``data_received`` cost a third of that and hand a reader every message that arrived together (bench/RESULTS.md,
"Streaming CPU per request"). The same holds for a unary call (``unary``): the health checks' Health and GetLoads
of every worker every interval were most of an idle node's CPU over grpc.aio (bench/RESULTS.md, "Mesh cost").

A thin asyncio shell around the sans-IO ``H2Connection``: one connection per worker, multiplexing every call
(like a gRPC channel), opened on first use and again after it was lost, went silent past its keepalive
(``h2_keepalive``: PING after silence, dead without an ACK), idled out, or the worker sent GOAWAY (no new
stream goes there; streams the worker will not process are sent again on a new connection, the others finish
on the old one). Calls beyond the worker's SETTINGS_MAX_CONCURRENT_STREAMS wait for a free stream. Failures
are ``CallFailed`` with a gRPC status; the caller maps them to its own errors.

A call may also be read by push (``call(push=...)``): the messages go to a callback in ``data_received``, as
they are parsed, and the reader is woken only for what the callback declined or when it asks. A streamed
token then costs no future, no task step and no generator resumption through the layers above (~4 µs per
token in a micro-benchmark of that chain; bench/RESULTS.md, 2026-12-08).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
import ssl as ssl_module
from collections.abc import AsyncGenerator, Sequence

import hpack

from node.workers.grpc_wire import (
    DEADLINE_EXCEEDED,
    INTERNAL,
    UNAVAILABLE,
    GrpcStatus,
    encode_message,
    request_headers,
)
from node.workers.h2_connection import H2Connection, Stream
from node.workers.h2_keepalive import Keepalive, KeepaliveAction, KeepaliveConfig
from node.workers.types import Pushed

log = logging.getLogger(__name__)

#: A push callback: the messages that arrived together on its stream (see ``H2GenerateChannel.call``).
RawPush = collections.abc.Callable[[list[bytes]], Pushed]

#: A call the worker refused before processing it (REFUSED_STREAM, GOAWAY) is sent again at most this often,
#: as grpc's transparent retry does: servers count streams as busy a little longer than the client can see.
MAX_UNPROCESSED_RETRIES = 10
#: A worker that does not accept the TCP connection and send its SETTINGS within this long is unavailable.
CONNECT_TIMEOUT_S = 5.0
#: A keepalive timer that fires this much late means our own loop was stalled: an ACK may be sitting unread
#: in the socket (uvloop runs timers before polling). Look again after one more I/O round before declaring
#: the worker dead: a starved gateway must not blame its workers.
LATE_TIMER_S = 0.05


class CallFailed(Exception):
    """A call ended with a non-OK gRPC status (connection failures are UNAVAILABLE)."""

    def __init__(self, status: GrpcStatus) -> None:
        super().__init__(f"{status.name}: {status.message}")
        self.status = status


class _Protocol(asyncio.Protocol):
    """Feeds the socket to the core, writes what it answers and wakes the readers of the streams it changed."""

    def __init__(
        self,
        core: H2Connection,
        on_stream_freed: collections.abc.Callable[[], None],
        keepalive: KeepaliveConfig,
    ) -> None:
        self.core = core
        self.waiters: dict[int, asyncio.Future[None]] = {}
        self.pushers: dict[int, RawPush] = {}  # streams read by push: their callbacks
        self.kicked: set[int] = set()  # streams whose push asked the reader to look (an empty batch)
        self._loop = asyncio.get_running_loop()
        self.ready: asyncio.Future[None] = self._loop.create_future()
        self._on_stream_freed = on_stream_freed
        self._transport: asyncio.Transport | None = None
        self._flush_pending = False
        self._keepalive_config = keepalive
        self._keepalive = Keepalive(keepalive, self._loop.time())
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's TCPTransport is not registered
        self.core.initiate()
        self.flush()
        self.poll_keepalive()

    def data_received(self, data: bytes) -> None:
        core = self.core
        frames, data_frames = core.frames_received, core.data_frames_received
        changed = core.receive_data(data)
        if core.frames_received != frames:
            now = self._loop.time()
            self._keepalive.heard(now, data=core.data_frames_received != data_frames)
            for payload in core.take_ping_acks():
                self._keepalive.acked(now, payload)
        self.flush()
        if core.ready and not self.ready.done():
            self.ready.set_result(None)
        self._wake(changed)
        if core.closed is not None:
            self.close()

    def poll_keepalive(self, *, fired_late: bool = False) -> None:
        """Act on the keepalive's verdict and arm the timer for its next look (call when a stream opens).
        ``fired_late``: called by a timer that ran late (our loop was stalled)."""
        if self._transport is None:
            return
        now = self._loop.time()
        action, next_at = self._keepalive.poll(now, self.core.active)
        if action is KeepaliveAction.DEAD and fired_late:
            self._arm(now + LATE_TIMER_S, grace=True)  # we were late, not (yet) the worker: one I/O round first
            return
        if action is KeepaliveAction.PING:
            self.core.send_ping(self._keepalive.ping_payload)
            self.flush()
        elif action is KeepaliveAction.DEAD:
            timeout = self._keepalive_config.timeout_s
            self._fail(f"no answer to a keepalive PING within {timeout:g} s: the worker or the path to it is gone")
            return
        elif action is KeepaliveAction.IDLE:
            self.close()
            return
        self._arm(next_at)

    def _arm(self, at: float, *, grace: bool = False) -> None:
        """Look again at ``at`` (or earlier, if a look is armed for earlier: that one re-arms)."""
        if at == math.inf:
            return
        if self._timer is not None:
            if self._timer_at <= at:
                return
            self._timer.cancel()
        self._timer_at = at
        self._timer = self._loop.call_at(at, self._on_timer, at, grace)

    def _on_timer(self, at: float, grace: bool) -> None:
        self._timer = None
        self.poll_keepalive(fired_late=not grace and self._loop.time() - at > LATE_TIMER_S)

    def _fail(self, reason: str) -> None:
        """The connection is dead: fail its streams with ``reason`` and drop the socket without a goodbye."""
        self._wake(self.core.connection_lost(reason))
        if self._transport is not None:
            self._transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
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
        pushers = self.pushers
        for stream in changed:
            if pushers and stream.messages and not stream.ended:
                push = pushers.get(stream.id)
                if push is not None:
                    verdict = self._push(push, stream)
                    if verdict is Pushed.TAKEN:
                        continue
                    if verdict is Pushed.TAKEN_WAKE:
                        self.kicked.add(stream.id)
            waiter = self.waiters.pop(stream.id, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
            freed = freed or stream.ended
        if freed:
            self._on_stream_freed()

    def _push(self, push: RawPush, stream: Stream) -> Pushed:
        """Hand the stream's unread messages (those it declined before first: order holds) to its push."""
        messages = stream.messages
        try:
            verdict = push(messages)
        except Exception:  # a push must not raise: a fault here would kill every stream of the connection
            log.exception("stream %d: push callback failed; its messages go to the reader", stream.id)
            del self.pushers[stream.id]
            return Pushed.DECLINED
        if verdict:
            stream.messages = []
        return verdict

    def flush(self) -> None:
        """Send what the core has queued, once per loop iteration: the calls started and the frames
        answered in one iteration (many at high concurrency) leave in one write, one syscall, at the end
        of the iteration's ready callbacks, before the loop polls again."""
        if not self._flush_pending:
            self._flush_pending = True
            self._loop.call_soon(self._flush_now)

    def _flush_now(self) -> None:
        self._flush_pending = False
        out = self.core.data_to_send()
        if out and self._transport is not None:
            self._transport.write(out)

    def close_if_idle(self) -> None:
        """A connection that takes no new calls closes once its last stream ended."""
        if not self.core.accepting and self.core.active == 0:
            self.close()

    def close(self) -> None:
        if self._transport is not None:
            self._flush_now()  # what was queued this iteration (a reset, GOAWAY) still leaves
            self._transport.close()


class H2GenerateChannel:
    """Server-streaming calls with one request message to ``host:port``, over one multiplexed connection."""

    def __init__(
        self,
        target: str,
        *,
        max_message_bytes: int,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        keepalive: KeepaliveConfig | None = None,
        ssl: ssl_module.SSLContext | None = None,
        server_name: str | None = None,
        connect_host: str | None = None,
    ) -> None:
        """``ssl``: connect with TLS, checking the certificate names ``server_name`` (default: the host).
        ``connect_host``: the address to connect to (default: the target's host), when the caller resolved
        the name itself; ``target`` still names the :authority."""
        host, _, port = target.rpartition(":")
        self._host = host.strip("[]")
        self._connect_host = connect_host or self._host
        self._port = int(port)
        self._authority = target
        self._max_message_bytes = max_message_bytes
        self._connect_timeout_s = connect_timeout_s
        self._keepalive = keepalive or KeepaliveConfig()
        self._ssl = ssl
        self._server_name = server_name or self._host
        self._current: _Protocol | None = None
        self._all: set[_Protocol] = set()
        self._lock = asyncio.Lock()
        self._openers: collections.deque[asyncio.Future[None]] = collections.deque()
        self._header_blocks: dict[str, bytes] = {}
        self._closed = False

    async def call(
        self,
        path: str,
        message: bytes,
        *,
        metadata: Sequence[tuple[str, str]] = (),
        push: RawPush | None = None,
    ) -> AsyncGenerator[list[bytes], None]:
        """Yield the response messages of one call, every message that arrived together as one list;
        ``metadata`` are extra request headers (lower-case names, e.g. traceparent).

        ``push``: called with the messages as they arrive, before the reader (``Pushed``): what it takes is
        never yielded; when it answers TAKEN_WAKE the reader is handed an empty list. Never called with the
        stream's last messages (those that arrive with its end go to the reader).

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
        if push is not None:
            conn.pushers[stream.id] = push
        conn.flush()
        conn.poll_keepalive()
        retries = 0
        try:
            while True:
                if conn.kicked and stream.id in conn.kicked:
                    conn.kicked.discard(stream.id)
                    yield []
                elif stream.messages:
                    batch = stream.messages
                    stream.messages = []
                    yield batch
                elif stream.ended and stream.unprocessed and retries < MAX_UNPROCESSED_RETRIES:
                    retries += 1
                    # Wait until a stream the worker does count ends (if any), then send the call again.
                    conn.pushers.pop(stream.id, None)
                    conn = await self._open_slot(wait=conn.core.active > 0)
                    stream = conn.core.open_stream(headers, body)
                    if push is not None:
                        conn.pushers[stream.id] = push
                    conn.flush()
                    conn.poll_keepalive()
                elif stream.ended:
                    status = stream.status
                    if status is not None and status.code != 0:
                        raise CallFailed(status)
                    return
                else:
                    waiter = conn.waiters[stream.id] = loop.create_future()
                    await waiter
        finally:
            conn.pushers.pop(stream.id, None)
            conn.kicked.discard(stream.id)
            if not stream.ended:
                conn.waiters.pop(stream.id, None)
                conn.core.cancel_stream(stream)
                conn.flush()
                self._stream_freed()
            conn.close_if_idle()

    async def unary(self, path: str, message: bytes, *, timeout_s: float) -> bytes:
        """The one response message of a unary call.

        Raises CallFailed: the call's non-OK status, DEADLINE_EXCEEDED after ``timeout_s`` (the stream is
        reset), INTERNAL when the worker answered with no message or more than one.
        """
        calls = self.call(path, message)
        got: list[bytes] = []
        try:
            async with asyncio.timeout(timeout_s):
                async for batch in calls:
                    got += batch
        except TimeoutError:
            raise CallFailed(GrpcStatus(DEADLINE_EXCEEDED, "Deadline Exceeded")) from None
        finally:
            await calls.aclose()  # a timeout or a cancellation resets the stream
        if len(got) != 1:
            raise CallFailed(GrpcStatus(INTERNAL, f"a unary call answered {len(got)} messages"))
        return got[0]

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
                        lambda: _Protocol(core, self._stream_freed, self._keepalive),
                        self._connect_host,
                        self._port,
                        ssl=self._ssl,
                        server_hostname=self._server_name if self._ssl is not None else None,
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
