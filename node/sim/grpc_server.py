"""A gRPC server for the simulated engine on asyncio, over `h2_server`'s sans-IO HTTP/2: the asyncio shell.

Why not grpc.aio's server: it costs ~55 µs of CPU per streamed message on these machines (a thread hop to the
core's event engine and back per write, half of it in the kernel), so at 200 output tokens the simulated
engine spent more CPU than the gateway it fed and capped every benchmark's throughput. Here a message is a
few microseconds of Python, and every stream's frames of one loop iteration leave in one write.

It takes the same registrations as ``grpc.aio.Server`` (the generated ``add_*Servicer_to_server`` functions
and generic handlers), for unary and server-streaming methods, and the servicer context's ``abort`` and
``send_initial_metadata``: what the simulated engine's services use. A streaming handler is paced by the
client's flow-control window: past ``PACE_BYTES`` queued for a stream it waits until the window opens.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Iterable, Mapping
from typing import Any, cast

import grpc
from google.protobuf.message import DecodeError  # type: ignore[import-untyped,unused-ignore]  # stubs optional

from node.sim import h2_server
from node.sim.h2_server import CallError, CallReady, CallReset, ServerConnection, WindowOpened

logger = logging.getLogger(__name__)

# A streaming handler waits for the window once this much of its stream is queued beyond it.
PACE_BYTES = 64 * 1024
# Messages a connection queues in one loop iteration before a sender yields to the loop: a handler that
# never awaits between messages (a fault's endless stream, under a client's huge window) must not starve it.
BURST_MESSAGES = 256
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
_OK, _UNKNOWN, _INTERNAL, _UNIMPLEMENTED, _UNAVAILABLE = 0, 2, 13, 12, 14


class _Abort(Exception):
    def __init__(self, code: int, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class _Context:
    """The part of ``grpc.aio.ServicerContext`` the simulated engine's handlers use."""

    __slots__ = ("_conn", "_metadata", "_sid")

    def __init__(self, conn: _Connection, sid: int, metadata: tuple[tuple[str, str], ...]) -> None:
        self._conn, self._sid, self._metadata = conn, sid, metadata

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise _Abort(int(code.value[0]), details)

    async def send_initial_metadata(self, metadata: Iterable[tuple[str, str]]) -> None:
        self._conn.core.send_headers(self._sid)
        self._conn.flush()

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def peer(self) -> str:
        return self._conn.peer


class _Details:
    """``grpc.HandlerCallDetails`` for a generic handler's lookup."""

    __slots__ = ("invocation_metadata", "method")

    def __init__(self, method: str) -> None:
        self.method = method
        self.invocation_metadata: tuple[tuple[str, str], ...] = ()


class NativeGrpcServer:
    """Registration and lifecycle as ``grpc.aio.Server`` (the subset the simulated worker uses)."""

    def __init__(
        self,
        *,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        max_concurrent_streams: int = h2_server.DEFAULT_MAX_CONCURRENT_STREAMS,
    ) -> None:
        self._max_message_bytes = max_message_bytes
        self._max_streams = max_concurrent_streams
        self._methods: dict[str, Any] = {}
        self._generic: list[Any] = []
        self._socket: socket.socket | None = None
        self._ssl: ssl.SSLContext | None = None
        self._server: asyncio.Server | None = None
        self._connections: set[_Connection] = set()

    # --- registration (what the generated add_*_to_server functions call) ---

    def add_generic_rpc_handlers(self, handlers: Iterable[Any]) -> None:
        self._generic.extend(handlers)

    def add_registered_method_handlers(self, service: str, handlers: Mapping[str, Any]) -> None:
        for name, handler in handlers.items():
            self._methods[f"/{service}/{name}"] = handler

    def handler(self, path: str) -> Any:
        found = self._methods.get(path)
        if found is not None:
            return found
        for generic in self._generic:
            found = generic.service(_Details(path))
            if found is not None:
                self._methods[path] = found  # bounded: only paths some handler serves are kept
                return found
        return None

    # --- lifecycle ---

    def add_insecure_port(self, address: str) -> int:
        return self._bind(address)

    def add_secure_port(self, address: str, context: ssl.SSLContext) -> int:
        self._ssl = context
        return self._bind(address)

    def _bind(self, address: str) -> int:
        host, _, port = address.rpartition(":")
        host = host.strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # not SO_REUSEPORT: a taken port fails
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # "[::]" takes IPv4 too, as grpcio
            sock.bind((host, int(port)))
            sock.listen(1024)
        except OSError as exc:
            sock.close()
            raise RuntimeError(f"cannot bind {address}: {exc.strerror or exc}") from None
        sock.setblocking(False)
        self._socket = sock
        bound: int = sock.getsockname()[1]
        return bound

    async def start(self) -> None:
        if self._socket is None or self._server is not None:
            return
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Connection(self), sock=self._socket, ssl=self._ssl)

    async def stop(self, grace: float | None) -> None:
        """Stop listening, let running calls finish for up to ``grace`` seconds, then cancel them and close."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        elif self._socket is not None:
            self._socket.close()
        self._socket = None
        for conn in list(self._connections):
            conn.go_away()
        running = [task for conn in self._connections for task in conn.calls.values()]
        if grace and running:
            await asyncio.wait(running, timeout=grace)
        for conn in list(self._connections):
            await conn.abort_calls()
            conn.close()
        if server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1.0)


class _Connection(asyncio.Protocol):
    def __init__(self, server: NativeGrpcServer) -> None:
        self._server = server
        self.core = ServerConnection(
            max_message_bytes=server._max_message_bytes, max_concurrent_streams=server._max_streams
        )
        self._transport: asyncio.Transport | None = None
        self._flush_pending = False
        self._burst = 0  # messages queued since the last flush
        self._writable: asyncio.Future[None] | None = None
        self.calls: dict[int, asyncio.Task[None]] = {}
        self._window_waiters: dict[int, asyncio.Future[None]] = {}
        self.peer = ""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass it
        peer = self._transport.get_extra_info("peername")
        self.peer = f"ipv4:{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else ""
        self._server._connections.add(self)
        self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._server._connections.discard(self)
        for task in self.calls.values():
            task.cancel()
        self._wake_all()

    def pause_writing(self) -> None:
        # A client that does not read what we send gets nothing more read either: what it makes us queue
        # (PING and SETTINGS acknowledgements included) stays within the transport's high-water mark.
        if self._writable is None:
            self._writable = asyncio.get_running_loop().create_future()
            if self._transport is not None:
                self._transport.pause_reading()

    def resume_writing(self) -> None:
        waiter, self._writable = self._writable, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
            if self._transport is not None and not self._transport.is_closing():
                self._transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        core = self.core
        for event in core.receive_data(data):
            if isinstance(event, CallReady):
                task = asyncio.get_running_loop().create_task(self._serve(event))
                self.calls[event.stream_id] = task
            elif isinstance(event, WindowOpened):
                self._wake(event.stream_id)
            elif isinstance(event, CallReset):
                reset = self.calls.pop(event.stream_id, None)
                if reset is not None:
                    reset.cancel()
                self._wake(event.stream_id)
            elif isinstance(event, CallError):
                core.send_trailers(event.stream_id, event.code, event.details)
        self.flush()
        if core.failed is not None:
            logger.debug("closing a connection: %s", core.failed)
            self.close()

    # --- sending ---

    def flush(self) -> None:
        """Write what the core queued once per loop iteration: every stream's frames of one iteration leave
        in one write (one system call)."""
        if not self._flush_pending:
            self._flush_pending = True
            asyncio.get_running_loop().call_soon(self._flush_now)

    def _flush_now(self) -> None:
        self._flush_pending = False
        self._burst = 0
        out = self.core.data_to_send()
        if out and self._transport is not None:
            self._transport.write(out)

    async def _send(self, sid: int, data: bytes) -> None:
        waiting = self.core.send_message(sid, data)
        self.flush()
        self._burst += 1
        if self._burst > BURST_MESSAGES:
            await asyncio.sleep(0)  # the flush runs, then the loop polls, then this sender goes on
        while waiting > PACE_BYTES or self._writable is not None:
            if self._transport is None:
                return  # the connection is gone: connection_lost cancels this call
            if self._writable is not None:
                await asyncio.shield(self._writable)
            else:
                waiter = self._window_waiters[sid] = asyncio.get_running_loop().create_future()
                await waiter
            stream = self.core.stream(sid)
            waiting = stream.pending_bytes if stream is not None else 0

    def _wake(self, sid: int) -> None:
        waiter = self._window_waiters.pop(sid, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _wake_all(self) -> None:
        for sid in list(self._window_waiters):
            self._wake(sid)
        self.resume_writing()

    # --- calls ---

    async def _serve(self, call: CallReady) -> None:
        core, sid, path, message = self.core, call.stream_id, call.path, call.message
        try:
            handler = self._server.handler(path)
            if handler is None:
                core.send_trailers(sid, _UNIMPLEMENTED, f"Method not found: {path}")
                return
            try:
                request = handler.request_deserializer(message) if handler.request_deserializer else message
            except DecodeError as exc:
                core.send_trailers(sid, _INTERNAL, f"Failed to parse the request: {exc}")
                return
            serialize = handler.response_serializer
            context = _Context(self, sid, call.metadata)
            if handler.unary_stream is not None:
                async for reply in handler.unary_stream(request, context):
                    await self._send(sid, reply if isinstance(reply, bytes) else serialize(reply))
            elif handler.unary_unary is not None:
                reply = await handler.unary_unary(request, context)
                await self._send(sid, reply if isinstance(reply, bytes) else serialize(reply))
            else:
                core.send_trailers(sid, _UNIMPLEMENTED, "client-streaming methods are not served here")
                return
            core.send_trailers(sid, _OK)
        except _Abort as abort:
            core.send_trailers(sid, abort.code, abort.details)
        except asyncio.CancelledError:
            core.reset(sid)  # the client reset the call or the server stops: nothing more goes out on it
            raise
        except Exception as exc:
            logger.exception("%s failed", path)
            core.send_trailers(sid, _UNKNOWN, f"Unexpected {type(exc).__name__}: {exc}")
        finally:
            if self.calls.get(sid) is asyncio.current_task():
                del self.calls[sid]
            self._window_waiters.pop(sid, None)
            self.flush()

    def go_away(self) -> None:
        """No new calls: GOAWAY with the last stream the client opened; running calls go on."""
        self.core.go_away()
        self.flush()

    async def abort_calls(self) -> None:
        tasks = list(self.calls.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def close(self) -> None:
        if self._transport is not None:
            self._flush_now()
            self._transport.close()


#: Either server: what the services' ``register`` methods take.
AnyServer = grpc.aio.Server | NativeGrpcServer


def server_ssl_context(cert_file: str, key_file: str, client_ca_file: str | None) -> ssl.SSLContext:
    """TLS for gRPC: HTTP/2 by ALPN (gRPC clients insist), client certificates required with a client CA."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_file, key_file)
    if client_ca_file:
        context.load_verify_locations(client_ca_file)
        context.verify_mode = ssl.CERT_REQUIRED
    context.set_alpn_protocols(["h2"])
    return context
