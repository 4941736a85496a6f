"""The sockets: one UDP endpoint for packets and one TCP listener for streams, on the same port.

Packets are best effort (``send_packet`` never raises); a stream is one request frame and one reply frame
per connection (join, push-pull, fallback ping). Socket errors are mapped to TransportError here, once.
Addresses are "host:port" strings with literal IPs ("[::1]:7946" for IPv6), never names to resolve.

With TLS contexts (mesh/tls.py) every stream is mutual TLS, both ways; a failed handshake is counted and
logged, never raised past the listener.

Inbound streams are bounded before anything is known of the peer (mesh/limits.py): at most
MAX_INBOUND_STREAMS at once and MAX_INBOUND_STREAMS_PER_HOST per address, counted from the accept (a TLS
handshake in progress included, and bounded by TLS_HANDSHAKE_TIMEOUT_S); the frame header and its first
MAX_PREAUTH_BYTES within STREAM_PREAUTH_TIMEOUT_S, then handed to ``admit`` (the core authenticates them
with the keyring) before anything more is read; the whole request within the stream timeout; the frame
read in pieces accounted against one budget (MAX_INBOUND_BUFFER_BYTES) shared by all inbound streams. A
stream over a bound is closed, counted (``streams_refused``) and logged (rate-limited); one that does not
authenticate is closed and counted by the core.

Outgoing streams leave from the bind address when it is a specific one, so peers see the address we
advertise (several members on 127.0.0.x of one host).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import ssl
from collections.abc import Callable
from typing import Protocol

from mesh.addr import WILDCARD_HOSTS, join_addr, split_addr
from mesh.codec import frame_length
from mesh.errors import DecodeError, TransportError
from mesh.limits import (
    MAX_INBOUND_BUFFER_BYTES,
    MAX_INBOUND_STREAMS,
    MAX_INBOUND_STREAMS_PER_HOST,
    MAX_PREAUTH_BYTES,
    STREAM_HEADER_BYTES,
    STREAM_PREAUTH_TIMEOUT_S,
    STREAM_READ_CHUNK_BYTES,
    TLS_HANDSHAKE_TIMEOUT_S,
)
from mesh.ratelog import RefusalLog
from mesh.tls import TlsContexts, on_handshake_failure

log = logging.getLogger(__name__)

PacketCallback = Callable[[bytes, str], None]
#: Called with a whole inbound frame (or just its header if the header is unacceptable); returns the reply.
StreamCallback = Callable[[bytes, str], "bytes | None"]
#: Called with an inbound frame's header, then with it and its first min(length, MAX_PREAUTH_BYTES) payload
#: bytes: whether to read on (False: close the stream; the callee counts why).
AdmitCallback = Callable[[bytes, str], bool]

#: Attempts to find a port free for both UDP and TCP when binding port 0.
_BIND_ATTEMPTS = 16
#: After a failed accept (no file descriptor left, mostly), the TLS listener waits this long before the next.
ACCEPT_RETRY_S = 0.1


#: Bind addresses that mean "every interface": outgoing streams from these leave from any address.
class Transport(Protocol):
    @property
    def port(self) -> int: ...

    def send_packet(self, addr: str, data: bytes) -> None: ...

    async def request(self, addr: str, frame: bytes, timeout_s: float) -> bytes:
        """Send one frame over a new stream and return the reply frame. Raises TransportError."""
        ...

    @property
    def tls_handshake_failures(self) -> int:
        """TLS handshakes that failed, inbound and outbound (0 without TLS)."""
        ...

    @property
    def streams_refused(self) -> int:
        """Inbound streams closed for exceeding a bound (count, buffer budget, header deadline)."""
        ...

    async def close(self) -> None: ...


class _Datagrams(asyncio.DatagramProtocol):
    def __init__(self, on_packet: PacketCallback) -> None:
        self._on_packet = on_packet

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        self._on_packet(data, join_addr(str(addr[0]), int(addr[1])))

    def error_received(self, exc: Exception) -> None:
        # ICMP unreachable from an earlier send: expected when a member dies; the probe logic copes.
        log.debug("udp error: %s", exc)


class _Refused(Exception):
    """An inbound stream exceeded a bound; the message says which."""


class _TlsListener:
    """The TCP listener of mesh TLS: accepts connections itself and hands each to ``on_accept`` with no byte
    read, so the connection can be counted before its handshake and the TLS layer reads the ClientHello
    (a server with ``ssl=`` handshakes before any handler runs; a plain stream would buffer it)."""

    def __init__(self, sock: socket.socket, on_accept: Callable[[socket.socket, str], None]) -> None:
        sock.setblocking(False)
        self.sockets = (sock,)
        self._on_accept = on_accept
        self._task = asyncio.get_running_loop().create_task(self._run(sock), name="mesh-tls-accept")

    async def _run(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, addr = await loop.sock_accept(sock)
            except OSError as exc:  # out of file descriptors, mostly: let some close
                log.warning("mesh: accepting a TCP stream failed: %s", _reason(exc))
                await asyncio.sleep(ACCEPT_RETRY_S)
                continue
            conn.setblocking(False)
            self._on_accept(conn, _peer(addr))

    def close(self) -> None:
        self._task.cancel()
        self.sockets[0].close()

    async def wait_closed(self) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


class _Streams:
    """The inbound side of streams: one owned task per connection, one frame in and one reply out within
    ``timeout_s``; over mutual TLS when given a server context, the handshake bounded by ``timeout_s`` too.
    Every bound of the module docstring is enforced here."""

    def __init__(
        self, on_stream: StreamCallback, admit: AdmitCallback, timeout_s: float, tls: ssl.SSLContext | None
    ) -> None:
        self.handlers: set[asyncio.Task[None]] = set()
        self.tls_failures = 0
        self.refused = 0
        #: Frame bytes held by the streams being read, against MAX_INBOUND_BUFFER_BYTES.
        self.buffered = 0
        self._per_host: dict[str, int] = {}
        self._on_stream = on_stream
        self._admit = admit
        self._timeout_s = timeout_s
        self._tls = tls
        self._refusals = RefusalLog(log)
        if tls is not None:
            on_handshake_failure(tls, self._tls_failed)

    async def listen(self, host: str, port: int) -> asyncio.Server | _TlsListener:
        """Raises OSError."""
        if self._tls is None:
            return await asyncio.start_server(self._serve, host, port, reuse_address=True)
        return _TlsListener(socket.create_server((host, port), family=_family(host)), self._accepted_tls)

    def _tls_failed(self, exc: ssl.SSLError) -> None:
        # The TLS layer drops the connection itself; the handler sees only an OSError.
        self.tls_failures += 1
        log.info("mesh: inbound TLS handshake refused: %s", _reason(exc))

    def _refuse(self, peer: str, why: str) -> None:
        self.refused += 1
        self._refusals.refused(asyncio.get_running_loop().time(), "inbound stream refused", f"{why} (from {peer})")

    def _over_cap(self, peer: str, host: str) -> bool:
        """A new connection from ``peer`` would exceed a stream cap: refused (counted, logged)."""
        if len(self.handlers) >= MAX_INBOUND_STREAMS:
            self._refuse(peer, f"{MAX_INBOUND_STREAMS} streams already open")
            return True
        if self._per_host.get(host, 0) >= MAX_INBOUND_STREAMS_PER_HOST:
            self._refuse(peer, f"{MAX_INBOUND_STREAMS_PER_HOST} streams already open from {host}")
            return True
        return False

    def _count(self, host: str, task: asyncio.Task[None]) -> None:
        self.handlers.add(task)
        self._per_host[host] = self._per_host.get(host, 0) + 1

    def _release(self, host: str, task: asyncio.Task[None]) -> None:
        self.handlers.discard(task)
        left = self._per_host[host] - 1
        if left:
            self._per_host[host] = left
        else:
            del self._per_host[host]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = _peer(writer.get_extra_info("peername"))
        host = _host(peer)
        task = asyncio.current_task()
        assert task is not None
        if self._over_cap(peer, host):
            writer.close()
            return
        self._count(host, task)
        try:
            await self._exchange(reader, writer, peer)
        finally:
            self._release(host, task)
            writer.close()

    def _accepted_tls(self, conn: socket.socket, peer: str) -> None:
        """A TCP connection accepted for mesh TLS: counted against the stream caps before its handshake starts
        (a flood of handshakes never finished holds at most MAX_INBOUND_STREAMS sockets, each for
        TLS_HANDSHAKE_TIMEOUT_S), or closed."""
        host = _host(peer)
        if self._over_cap(peer, host):
            conn.close()
            return
        self._count(host, asyncio.get_running_loop().create_task(self._serve_tls(conn, peer, host)))

    async def _serve_tls(self, conn: socket.socket, peer: str, host: str) -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        writer: asyncio.StreamWriter | None = None
        timeout_s = min(TLS_HANDSHAKE_TIMEOUT_S, self._timeout_s)
        try:  # (cancelled before its first step, at shutdown, it never ran: ``conn`` closes when collected)
            reader = asyncio.StreamReader(loop=loop)
            protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
            try:
                async with asyncio.timeout(timeout_s):
                    # The TLS layer owns ``conn`` from here (and closes it if the handshake fails).
                    transport, _ = await loop.connect_accepted_socket(
                        lambda: protocol, conn, ssl=self._tls, ssl_handshake_timeout=timeout_s
                    )
            except TimeoutError:
                self._refuse(peer, f"no TLS handshake within {timeout_s:g} s")
                return
            except OSError as exc:  # ssl.SSLError among them, counted by the context's hook
                log.debug("TLS handshake with %s failed: %r", peer, exc)
                return
            writer = asyncio.StreamWriter(transport, protocol, reader, loop)
            await self._exchange(reader, writer, peer)
        finally:
            self._release(host, task)
            if writer is not None:
                writer.close()
                # The TLS goodbye is bounded too (asyncio would wait 30 s for the peer's).
                loop.call_later(self._timeout_s, writer.transport.abort)

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str) -> None:
        """One frame in, one reply out, within the stream timeout; failures are counted or logged here."""
        held = [0]  # bytes of this stream counted in self.buffered
        try:
            async with asyncio.timeout(self._timeout_s):
                frame = await self._read_frame(reader, peer, held)
                reply = None if frame is None else self._on_stream(frame, peer)
                if reply is not None:
                    writer.write(reply)
                    await writer.drain()
        except _Refused as exc:
            self._refuse(peer, str(exc))
        except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
            log.debug("stream from %s failed: %r", peer, exc)
        finally:
            self.buffered -= held[0]

    async def _read_frame(self, reader: asyncio.StreamReader, peer: str, held: list[int]) -> bytes | None:
        """The whole frame (just its header if the header is unacceptable, for the core to count), or None if
        ``admit`` refused its first bytes. Raises _Refused, IncompleteReadError, OSError."""
        try:
            async with asyncio.timeout(min(STREAM_PREAUTH_TIMEOUT_S, self._timeout_s)):
                header = await reader.readexactly(STREAM_HEADER_BYTES)
                try:
                    length = frame_length(header)
                except DecodeError:
                    return header
                if not self._admit(header, peer):  # e.g. plaintext to a keyed member: no need to read on
                    return None
                parts = [header]
                await self._read_into(parts, reader, min(length, MAX_PREAUTH_BYTES), held)
        except TimeoutError:
            raise _Refused(f"not authenticated within {STREAM_PREAUTH_TIMEOUT_S:g} s") from None
        if not self._admit(b"".join(parts), peer):
            return None
        await self._read_into(parts, reader, length - min(length, MAX_PREAUTH_BYTES), held)
        return b"".join(parts)

    async def _read_into(self, parts: list[bytes], reader: asyncio.StreamReader, length: int, held: list[int]) -> None:
        """Append ``length`` bytes to ``parts`` in pieces, each counted in ``buffered`` (and ``held[0]``)
        before it is read. Raises _Refused when the shared budget is exhausted, IncompleteReadError/OSError."""
        remaining = length
        while remaining:
            size = min(STREAM_READ_CHUNK_BYTES, remaining)
            if self.buffered + size > MAX_INBOUND_BUFFER_BYTES:
                raise _Refused(f"inbound stream buffers full ({MAX_INBOUND_BUFFER_BYTES} bytes)")
            self.buffered += size
            held[0] += size
            parts.append(await reader.readexactly(size))
            remaining -= size


class AsyncioTransport:
    """UDP + TCP on one port, over the running event loop; streams optionally over mutual TLS."""

    def __init__(
        self,
        udp: asyncio.DatagramTransport,
        server: asyncio.Server | _TlsListener,
        port: int,
        streams: _Streams,
        *,
        source_host: str,
        stream_timeout_s: float,
        tls: TlsContexts | None,
    ) -> None:
        self._udp = udp
        self._server = server
        self._port = port
        self._streams = streams
        self._source_host = source_host
        self._stream_timeout_s = stream_timeout_s
        self._tls = tls
        self._tls_failures_out = 0

    @property
    def port(self) -> int:
        return self._port

    @property
    def tls_handshake_failures(self) -> int:
        return self._streams.tls_failures + self._tls_failures_out

    @property
    def streams_refused(self) -> int:
        return self._streams.refused

    @classmethod
    async def bind(
        cls,
        host: str,
        port: int,
        *,
        on_packet: PacketCallback,
        on_stream: StreamCallback,
        admit_stream: AdmitCallback,
        stream_timeout_s: float,
        tls: TlsContexts | None = None,
    ) -> AsyncioTransport:
        """Listen on ``host:port`` (port 0: a free port for both protocols). Raises TransportError."""
        loop = asyncio.get_running_loop()
        streams = _Streams(on_stream, admit_stream, stream_timeout_s, None if tls is None else tls.server)
        last_error: OSError | None = None
        for _ in range(_BIND_ATTEMPTS if port == 0 else 1):
            server: asyncio.Server | _TlsListener | None = None
            try:
                server = await streams.listen(host, port)
                bound = int(server.sockets[0].getsockname()[1])
                udp, _ = await loop.create_datagram_endpoint(
                    lambda: _Datagrams(on_packet), local_addr=(host, bound), family=_family(host)
                )
            except OSError as exc:
                last_error = exc
                if server is not None:
                    server.close()
                    await server.wait_closed()
                if exc.errno != errno.EADDRINUSE:
                    break
                continue
            return cls(
                udp,
                server,
                bound,
                streams,
                source_host="" if host in WILDCARD_HOSTS else host,
                stream_timeout_s=stream_timeout_s,
                tls=tls,
            )
        raise TransportError(f"cannot bind {host}:{port}: {last_error}") from last_error

    def send_packet(self, addr: str, data: bytes) -> None:
        try:
            self._udp.sendto(data, split_addr(addr))
        except (OSError, ValueError) as exc:
            log.debug("udp send to %s failed: %s", addr, exc)

    async def request(self, addr: str, frame: bytes, timeout_s: float) -> bytes:
        writer: asyncio.StreamWriter | None = None
        try:
            host, port = split_addr(addr)
            async with asyncio.timeout(max(timeout_s, 0.0)):
                reader, writer = await self._connect(host, port)
                writer.write(frame)
                await writer.drain()
                header = await reader.readexactly(STREAM_HEADER_BYTES)
                return header + await reader.readexactly(frame_length(header))
        except ssl.SSLError as exc:
            # Its certificate did not verify. (When it refuses ours instead, we see a closed connection: TLS 1.3
            # clients finish their side of the handshake first. The peer counts that one.)
            self._tls_failures_out += 1
            log.info("mesh: TLS with %s failed: %s", addr, _reason(exc))
            raise TransportError(f"stream to {addr}: {exc!r}") from exc
        except (OSError, TimeoutError, ValueError, asyncio.IncompleteReadError, DecodeError) as exc:
            raise TransportError(f"stream to {addr}: {exc!r}") from exc
        finally:
            if writer is not None:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()

    async def _connect(self, host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Raises OSError (ssl.SSLError included)."""
        source = self._source_host
        local_addr = (source, 0) if source and _family(source) == _family(host) else None
        if self._tls is None:
            return await asyncio.open_connection(host, port, local_addr=local_addr)
        # The TLS closing exchange after the reply is bounded too; the handshake is within the caller's timeout.
        return await asyncio.open_connection(
            host,
            port,
            local_addr=local_addr,
            ssl=self._tls.client,
            ssl_shutdown_timeout=self._stream_timeout_s,
        )

    async def close(self) -> None:
        self._server.close()
        handlers = list(self._streams.handlers)
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        await self._server.wait_closed()
        self._udp.close()


def _reason(exc: BaseException) -> str:
    """The exception's message, or its type when it has none (a peer hanging up mid-handshake)."""
    return str(exc) or type(exc).__name__


def _host(peer: str) -> str:
    return split_addr(peer)[0] if peer != "?:0" else peer


def _peer(name: object) -> str:
    """The "host:port" of a socket's peer name (or "?:0" if the socket has none)."""
    if isinstance(name, tuple) and len(name) >= 2:
        return join_addr(str(name[0]), int(name[1]))
    return "?:0"


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET
