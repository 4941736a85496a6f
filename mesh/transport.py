"""The sockets: one UDP endpoint for packets and one TCP listener for streams, on the same port.

Packets are best effort (``send_packet`` never raises); a stream is one request frame and one reply frame
per connection (join, push-pull, fallback ping). Socket errors are mapped to TransportError here, once.
Addresses are "host:port" strings with literal IPs ("[::1]:7946" for IPv6), never names to resolve.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
import socket
from collections.abc import Callable
from typing import Protocol

from mesh.codec import frame_length
from mesh.errors import DecodeError, TransportError
from mesh.limits import STREAM_HEADER_BYTES

log = logging.getLogger(__name__)

PacketCallback = Callable[[bytes, str], None]
#: Called with a whole inbound frame (or just its header if the header is unacceptable); returns the reply.
StreamCallback = Callable[[bytes, str], "bytes | None"]

#: Attempts to find a port free for both UDP and TCP when binding port 0.
_BIND_ATTEMPTS = 16


@functools.lru_cache(maxsize=4096)
def split_addr(addr: str) -> tuple[str, int]:
    """ "host:port" -> (host, port); brackets around an IPv6 host are removed. Raises ValueError."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"expected host:port, got {addr!r}")
    return host.strip("[]"), int(port)


def join_addr(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Transport(Protocol):
    @property
    def port(self) -> int: ...

    def send_packet(self, addr: str, data: bytes) -> None: ...

    async def request(self, addr: str, frame: bytes, timeout_s: float) -> bytes:
        """Send one frame over a new stream and return the reply frame. Raises TransportError."""
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


class AsyncioTransport:
    """UDP + TCP on one port, over the running event loop."""

    def __init__(
        self,
        udp: asyncio.DatagramTransport,
        server: asyncio.Server,
        port: int,
        handlers: set[asyncio.Task[None]],
    ) -> None:
        self._udp = udp
        self._server = server
        self._port = port
        self._handlers = handlers

    @property
    def port(self) -> int:
        return self._port

    @classmethod
    async def bind(
        cls,
        host: str,
        port: int,
        *,
        on_packet: PacketCallback,
        on_stream: StreamCallback,
        stream_timeout_s: float,
    ) -> AsyncioTransport:
        """Listen on ``host:port`` (port 0: a free port for both protocols). Raises TransportError."""
        loop = asyncio.get_running_loop()
        handlers: set[asyncio.Task[None]] = set()

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            handlers.add(task)
            try:
                peer = writer.get_extra_info("peername")
                peer_addr = join_addr(str(peer[0]), int(peer[1])) if peer else "?:0"
                async with asyncio.timeout(stream_timeout_s):
                    header = await reader.readexactly(STREAM_HEADER_BYTES)
                    try:
                        frame = header + await reader.readexactly(frame_length(header))
                    except DecodeError:
                        frame = header  # let the core count it as malformed
                    reply = on_stream(frame, peer_addr)
                    if reply is not None:
                        writer.write(reply)
                        await writer.drain()
            except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
                log.debug("stream from peer failed: %r", exc)
            finally:
                handlers.discard(task)
                writer.close()

        last_error: OSError | None = None
        for _ in range(_BIND_ATTEMPTS if port == 0 else 1):
            server: asyncio.Server | None = None
            try:
                server = await asyncio.start_server(serve, host, port, reuse_address=True)
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
            return cls(udp, server, bound, handlers)
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
                reader, writer = await asyncio.open_connection(host, port)
                writer.write(frame)
                await writer.drain()
                header = await reader.readexactly(STREAM_HEADER_BYTES)
                return header + await reader.readexactly(frame_length(header))
        except (OSError, TimeoutError, ValueError, asyncio.IncompleteReadError, DecodeError) as exc:
            raise TransportError(f"stream to {addr}: {exc!r}") from exc
        finally:
            if writer is not None:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()

    async def close(self) -> None:
        self._server.close()
        handlers = list(self._handlers)
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        await self._server.wait_closed()
        self._udp.close()


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET
