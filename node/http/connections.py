"""Client connections of the HTTP server: how many may be open, how long each may take, what each may make us
buffer.

aiohttp's `RequestHandler` parses and answers requests; `GuardedHandler` (one per connection) adds the bounds it
lacks, and `ConnectionGate` (one per server) admits connections under a cap:

- header timeout: a request head (request line and headers) must be complete within ``header_timeout_s`` of the
  connection being accepted, or of the first byte of a later request on a kept-alive connection (slowloris,
  dribbling a header byte at a time, is closed);
- idle timeout: aiohttp's keep-alive timeout closes a connection that has sent no request ``idle_timeout_s``
  after its last response;
- body timeout: a request body must be complete within ``body_timeout_s`` of its head;
- write timeout: a connection whose write buffer stays above `WRITE_HIGH_WATER_BYTES` (the kernel's send
  buffer, `SEND_BUFFER_BYTES`, full: the client reads nothing) for ``write_timeout_s`` is aborted. Its handler is
  cancelled, which closes the generation and aborts the worker request, as when a client disconnects;
- cap: at ``max_connections`` a new connection replaces the one that has waited longest without a request (idle,
  or still sending its head); only when every connection is busy with a request is the new one refused with a
  503. Both are counted (/metrics) and logged, at most one line per `CAP_LOG_INTERVAL_S`;
- rate: a client address opening connections faster than its token bucket allows (``connection_rate``) is
  answered 429 and closed; counted and logged likewise.

The cap is applied when the connection is accepted (so HTTPS handshakes in progress count against it); the
rate in `_Admission.connection_made`, the first place the peer's address is known (at the cap, a connection
refused there may already have evicted a waiting one). An admitted connection's protocol is then switched to
its `GuardedHandler`.

Invariant: every connection this server accepted is either refused at once or counted in ``open`` until its
``connection_lost`` (or until it is evicted, whose socket closes on the next loop iteration).
"""

from __future__ import annotations

import asyncio
import logging
import resource
import socket
import ssl
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import web
from aiohttp.streams import StreamReader
from aiohttp.typedefs import Middleware

from node.http.connection_rate import ConnectionRate
from node.http.errors import error_body
from node.http.protocol import EnvelopeRequestHandler

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

#: A connection's transport pauses the writer above this many buffered bytes (the low mark is a quarter of it,
#: asyncio's default ratio). It bounds what a slow reader makes us hold per connection, beyond the kernel's own
#: send buffer: SSE writes wait for the drain above it (node/http/sse.py), and a client that lets it stay above
#: for write_timeout_s is dropped. 64 KiB holds hundreds of SSE frames: a reading client never waits on it.
WRITE_HIGH_WATER_BYTES = 64 * 1024
#: The kernel's send buffer of a client connection (SO_SNDBUF; Linux doubles it for its bookkeeping). Left to
#: autotuning it grows to net.ipv4.tcp_wmem's maximum (4 MiB by default): a client that reads nothing would
#: have ~30,000 tokens of SSE buffered before we notice, i.e. the worker generates its whole answer for nobody,
#: and a few thousand such clients pin gigabytes of kernel memory (charged to the node's cgroup). 128 KiB
#: (2,000 tokens of SSE) still moves 1.3 MB/s at a 100 ms round trip, far above any token stream.
SEND_BUFFER_BYTES = 128 * 1024
#: File descriptors kept free below RLIMIT_NOFILE for everything that is not a client connection: worker
#: channels (a gRPC channel and an HTTP/2 connection per worker), mesh sockets (UDP, the TCP listener, one
#: stream per push-pull), storage pools (Redis, Postgres), the event loop's own fds, log and model files, and
#: the connections accepted in one burst whose refusal or eviction closes them an iteration later.
FD_HEADROOM = 512
#: Without an explicit --max-connections, never more than this many: an idle connection costs ~10 KB of
#: memory in the node (the handler, its parser and task) plus kernel buffers, and a node's useful concurrency
#: is bounded by its workers' batch sizes long before this.
MAX_CONNECTIONS_CEILING = 16384
#: The cap's log line (evictions, refusals) is written at most this often; /metrics counts every one.
CAP_LOG_INTERVAL_S = 10.0
#: An HTTPS handshake must finish within header_timeout_s (the TLS layer aborts it then); a connection whose
#: protocol has not started this much later failed its handshake, and its place under the cap is given back.
HANDSHAKE_SLACK_S = 1.0
#: Addresses remembered between two rate-limit log lines (the line names the busiest three).
RATE_LOG_ADDRESSES = 1024
#: Reasons a connection is closed by us, as /metrics labels them.
CLOSE_REASONS = ("header_timeout", "body_timeout", "write_timeout", "evicted")

_REFUSAL_BODY = error_body(
    "The server has too many open connections; retry shortly.", "server_error", code="too_many_connections"
)
#: The whole answer to a refused connection, written before its request is read (the client may see the
#: connection reset instead, if its request arrives after the close).
REFUSAL_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
    b"Connection: close\r\nContent-Length: %d\r\n\r\n%b" % (len(_REFUSAL_BODY), _REFUSAL_BODY)
)
_RATE_BODY = error_body(
    "This address opens connections too fast; reuse connections (keep-alive) or retry shortly.",
    "rate_limit_error",
    code="connection_rate_exceeded",
)
#: The answer to a connection over its address's rate, likewise written before its request is read.
RATE_LIMITED_RESPONSE = (
    b"HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
    b"Connection: close\r\nContent-Length: %d\r\n\r\n%b" % (len(_RATE_BODY), _RATE_BODY)
)


def fd_room() -> int | None:
    """Client connections this process's open-file limit (RLIMIT_NOFILE, soft) leaves room for, `FD_HEADROOM`
    kept free; None when it is unlimited."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft - FD_HEADROOM


def default_max_connections() -> int:
    """The cap without --max-connections: what the open-file limit leaves, at most `MAX_CONNECTIONS_CEILING`."""
    room = fd_room()
    return MAX_CONNECTIONS_CEILING if room is None else max(1, min(room, MAX_CONNECTIONS_CEILING))


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    max_connections: int
    idle_timeout_s: float
    header_timeout_s: float
    body_timeout_s: float
    write_timeout_s: float


class ConnectionGate:
    """Counts a server's open connections and admits new ones under the cap (evicting a waiting one first)."""

    def __init__(
        self, limits: ConnectionLimits, clock: Callable[[], float], rate: ConnectionRate | None = None
    ) -> None:
        """``rate``: the per-address connection rate (None: not limited)."""
        self.limits = limits
        self.open = 0
        self.refused = 0
        self.rate_limited = 0
        self._rate = rate
        # Admitted connections whose protocol has not started yet (an HTTPS handshake in progress), oldest first.
        # A handshake that fails never reaches the protocol again (asyncio drops it silently), so its place is
        # given back once the handshake deadline (header_timeout_s) and HANDSHAKE_SLACK_S have passed.
        self._handshaking: dict[object, float] = {}
        self._rate_logged_at: float | None = None
        self._rate_unlogged: Counter[str] = Counter()
        self.closed: Counter[str] = Counter()
        self._clock = clock
        # Connections not serving a request, in the order they started waiting (oldest first): who to evict.
        self._waiting: dict[GuardedHandler, None] = {}
        self._logged_at: float | None = None
        self._unlogged: Counter[str] = Counter()

    def admit(self, pending: object | None = None) -> bool:
        """Whether a new connection may be served; at the cap, makes room by evicting the longest-waiting one.
        ``pending``: the connection's key until ``started`` (its place is given back if that never comes)."""
        self._expire_handshakes()
        if self.open >= self.limits.max_connections:
            if not self._waiting:
                self.refused += 1
                self._note("refused")
                return False
            victim = next(iter(self._waiting))
            self.drop(victim, "evicted")
            self._note("evicted")
        self.open += 1
        if pending is not None:
            self._handshaking[pending] = self._clock()
        return True

    def started(self, pending: object) -> bool:
        """The connection admitted as ``pending`` reached its protocol; False if its place was given back."""
        return self._handshaking.pop(pending, None) is not None

    def _expire_handshakes(self) -> None:
        if not self._handshaking:
            return
        cutoff = self._clock() - self.limits.header_timeout_s - HANDSHAKE_SLACK_S
        while self._handshaking:
            key = next(iter(self._handshaking))
            if self._handshaking[key] > cutoff:
                break
            del self._handshaking[key]
            self.open -= 1

    def rate_admits(self, address: str) -> bool:
        """Whether a connection from ``address`` is within its address's rate (then it takes a token);
        a refusal is counted and logged."""
        if self._rate is None:
            return True
        now = self._clock()
        if self._rate.allow(address, now):
            return True
        self.rate_limited += 1
        self._rate_unlogged[address] += 1
        if self._rate_logged_at is None or now - self._rate_logged_at >= CAP_LOG_INTERVAL_S:
            since = f" in the last {now - self._rate_logged_at:.0f} s" if self._rate_logged_at is not None else ""
            top = ", ".join(f"{addr} ({n})" for addr, n in self._rate_unlogged.most_common(3))
            log.warning(
                "connection rate (--connection-rate-per-s) exceeded: %d connection(s) refused with 429%s, from %s",
                sum(self._rate_unlogged.values()),
                since,
                top,
            )
            self._rate_logged_at = now
            self._rate_unlogged.clear()
        elif len(self._rate_unlogged) > RATE_LOG_ADDRESSES:  # bounded between two lines
            self._rate_unlogged = Counter(dict(self._rate_unlogged.most_common(RATE_LOG_ADDRESSES // 2)))
        return False

    def unadmit(self) -> None:
        """A connection ``admit`` counted is refused after all (by the rate) before it got a handler."""
        self.open -= 1

    def drop(self, handler: GuardedHandler, reason: str) -> None:
        """Close ``handler``'s connection now (no flush), counted as ``reason``."""
        self.closed[reason] += 1
        self.release(handler)
        handler.abort()

    def release(self, handler: GuardedHandler) -> None:
        """``handler``'s connection no longer counts (idempotent)."""
        self._waiting.pop(handler, None)
        if handler.counted:
            handler.counted = False
            self.open -= 1

    def waiting(self, handler: GuardedHandler, waiting: bool) -> None:
        """``handler`` now waits for a request (an eviction candidate, the newest) or serves one (not one)."""
        self._waiting.pop(handler, None)
        if waiting and handler.counted:
            self._waiting[handler] = None  # re-inserted: now the newest

    def _note(self, kind: str) -> None:
        self._unlogged[kind] += 1
        now = self._clock()
        if self._logged_at is not None and now - self._logged_at < CAP_LOG_INTERVAL_S:
            return
        since = f" in the last {now - self._logged_at:.0f} s" if self._logged_at is not None else ""
        log.warning(
            "connection cap (--max-connections %d) reached: %d waiting connection(s) closed to admit new ones, "
            "%d new connection(s) refused with 503%s",
            self.limits.max_connections,
            self._unlogged["evicted"],
            self._unlogged["refused"],
            since,
        )
        self._logged_at = now
        self._unlogged.clear()

    def middleware(self) -> Middleware:
        """Tells each connection when it starts serving a request (its head is complete); the end is
        `GuardedHandler.finish_response`. Outermost, so it runs before any other middleware."""

        @web.middleware
        async def track(request: web.Request, handler: Handler) -> web.StreamResponse:
            protocol = request.protocol
            if isinstance(protocol, GuardedHandler):
                protocol.request_started(request.content)
            return await handler(request)

        return track


class GuardedHandler(EnvelopeRequestHandler):
    """aiohttp's handler of one connection, with the header, body and write timeouts (see the module doc), and
    aiohttp's own rejections in OpenAI's envelope (node/http/protocol.py).

    Timers run on the loop's clock; each is armed only while its phase lasts: header from the accept (or the
    first byte after a response) to the request's start, body from the start to the body's end, write while
    the transport is paused.
    """

    __slots__ = ("_body", "_body_timer", "_gate", "_head_timer", "_serving", "_timers", "_write_timer", "counted")

    def __init__(self, manager: web.Server, gate: ConnectionGate, handler_args: Mapping[str, Any]) -> None:
        loop = asyncio.get_running_loop()
        args = {**handler_args, "keepalive_timeout": gate.limits.idle_timeout_s}
        super().__init__(manager, loop=loop, **args)
        self._timers = loop
        self._gate = gate
        self.counted = True  # the gate counted this connection when it admitted it
        self._serving = False
        self._body: StreamReader | None = None
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._write_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        # uvloop's TCPTransport is not registered as an asyncio.WriteTransport, but has the method.
        cast(asyncio.WriteTransport, transport).set_write_buffer_limits(high=WRITE_HIGH_WATER_BYTES)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
        self._gate.waiting(self, True)
        self._arm_head()

    def data_received(self, data: bytes) -> None:
        if not self._serving and self._head_timer is None:
            self._arm_head()  # the first byte of a request on a kept-alive connection
        super().data_received(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        for timer in (self._head_timer, self._body_timer, self._write_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._body_timer = self._write_timer = None
        self._gate.release(self)
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        super().pause_writing()
        self._write_timer = self._timers.call_later(self._gate.limits.write_timeout_s, self._expired, "write_timeout")

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def request_started(self, body: StreamReader) -> None:
        """A request's head is complete and its handler starts."""
        self._serving = True
        self._gate.waiting(self, False)
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        if not body.is_eof():
            self._body = body
            self._body_timer = self._timers.call_later(self._gate.limits.body_timeout_s, self._body_expired)

    async def finish_response(
        self, request: web.BaseRequest, resp: web.StreamResponse, start_time: float | None
    ) -> tuple[web.StreamResponse, bool]:
        try:
            return await super().finish_response(request, resp, start_time)
        finally:
            # The response is written (or failed): the connection waits for its next request.
            self._serving = False
            self._body = None
            if self._body_timer is not None:
                self._body_timer.cancel()
                self._body_timer = None
            self._gate.waiting(self, True)

    def abort(self) -> None:
        """Close the connection without flushing what is buffered (a stalled client would never take it)."""
        if self.transport is not None:
            self.transport.abort()

    def _arm_head(self) -> None:
        self._head_timer = self._timers.call_later(self._gate.limits.header_timeout_s, self._expired, "header_timeout")

    def _body_expired(self) -> None:
        self._body_timer = None
        if self._body is not None and not self._body.is_eof():
            self._expired("body_timeout")

    def _expired(self, reason: str) -> None:
        log.debug("closing connection %s: %s", self.peername, reason.replace("_", " "))
        self._gate.drop(self, reason)


class _Admission(asyncio.Protocol):
    """A new connection, until it is admitted (its protocol becomes a `GuardedHandler`) or refused: over its
    address's rate, answered 429; past the cap while every open one is busy, 503; either closed, its request
    unread."""

    __slots__ = ("_admitted", "_gate", "_handler")

    def __init__(self, gate: ConnectionGate, handler: Callable[[], GuardedHandler]) -> None:
        self._gate = gate
        self._handler = handler
        self._admitted = gate.admit(self)  # at the accept: counted from here (an HTTPS handshake included)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self._admitted and not self._gate.started(self):
            self._admitted = self._gate.admit()  # (given back as a failed handshake: counted again)
        peer = transport.get_extra_info("peername")
        address = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        refusal = None
        if not self._admitted:
            refusal = REFUSAL_RESPONSE
        elif not self._gate.rate_admits(address):
            self._gate.unadmit()
            refusal = RATE_LIMITED_RESPONSE
        if refusal is not None:
            out = cast(asyncio.WriteTransport, transport)
            out.write(refusal)
            out.close()
            return
        handler = self._handler()
        transport.set_protocol(handler)
        handler.connection_made(transport)


async def listen(
    runner: web.AppRunner,
    gate: ConnectionGate,
    *,
    host: str,
    port: int,
    backlog: int,
    reuse_port: bool,
    ssl_context: ssl.SSLContext | None = None,
) -> asyncio.Server:
    """Serve ``runner``'s application on host:port, every connection through ``gate``. The caller closes the
    returned server (stop accepting) before ``runner.cleanup()`` (which drains the open connections)."""
    server = runner.server
    if server is None:
        raise RuntimeError("listen() needs runner.setup() first")
    # What aiohttp passes every connection's RequestHandler: the runner's arguments (access_log=None) and the
    # application's handler_args (header limits, no auto-decompression; node/http/server.py). web.Server keeps
    # them without a public accessor; they are only read here.
    handler_args: Mapping[str, Any] = server._kwargs

    def connection() -> asyncio.Protocol:
        return _Admission(gate, lambda: GuardedHandler(server, gate, handler_args))

    loop = asyncio.get_running_loop()
    # The handshake is part of the request head's time (asyncio's default would allow it 60 s).
    handshake_s = gate.limits.header_timeout_s if ssl_context is not None else None
    return await loop.create_server(
        connection,
        host,
        port,
        backlog=backlog,
        reuse_port=reuse_port,
        ssl=ssl_context,
        ssl_handshake_timeout=handshake_s,
    )
