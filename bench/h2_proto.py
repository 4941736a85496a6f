"""A measuring prototype, not a client: Generate streams read by a bare asyncio HTTP/2 protocol instead of grpc.aio.

It exists to price the alternative to grpc.aio's per-message machinery (a batch op, a future, a hop through
gRPC's completion-queue poller thread and a socket wake-up per message, gRPC's C++ threads besides). One
TCP connection, frames parsed in `data_received` on the event loop, every complete gRPC message of a stream
queued for its reader, which takes all that are queued at once (so messages that arrive together are handled
together: the coalescing a streaming gateway wants).

Deliberately left out, so never use it outside bench/: HPACK decoding (response headers and trailers are
skipped, so grpc-status is not checked and the server's dynamic table is not tracked), outgoing flow control
(requests must fit the peer's initial windows), CONTINUATION, GOAWAY, RST_STREAM, reconnects, deadlines.
"""

from __future__ import annotations

import asyncio
import collections
import collections.abc
import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7, 0x8
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY = 0x1, 0x1, 0x4, 0x8, 0x20
SETTINGS_ENABLE_PUSH, SETTINGS_INITIAL_WINDOW_SIZE = 0x2, 0x4
MAX_WINDOW = 2**31 - 1
# Top the connection window up once this much was received (the stream windows start at MAX_WINDOW).
WINDOW_REFILL = 1 << 24
_HEAD = struct.Struct(">I")


def _frame(kind: int, flags: int, stream_id: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream_id.to_bytes(4, "big") + payload


def _literal(name: bytes, value: bytes) -> bytes:
    """HPACK literal header field without indexing, new name, no Huffman (lengths < 127 only)."""
    return b"\x00" + bytes((len(name),)) + name + bytes((len(value),)) + value


class _Stream:
    __slots__ = ("done", "messages", "pending", "waiter")

    def __init__(self) -> None:
        self.messages: collections.deque[bytes] = collections.deque()
        self.pending = bytearray()  # DATA bytes not yet a whole gRPC message
        self.done = False
        self.waiter: asyncio.Future[None] | None = None


class H2GrpcConnection(asyncio.Protocol):
    def __init__(self, authority: str) -> None:
        self._authority = authority.encode()
        self._transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._streams: dict[int, _Stream] = {}
        self._next_id = 1
        self._received = 0
        self.wakeups = 0
        self.messages = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's TCPTransport is not registered
        settings = struct.pack(">HIHI", SETTINGS_ENABLE_PUSH, 0, SETTINGS_INITIAL_WINDOW_SIZE, MAX_WINDOW)
        self._write(
            PREFACE + _frame(SETTINGS, 0, 0, settings) + _frame(WINDOW_UPDATE, 0, 0, _HEAD.pack(MAX_WINDOW - 65535))
        )

    def open(self, path: str, message: bytes) -> _Stream:
        assert self._transport is not None
        sid = self._next_id
        self._next_id += 2
        stream = self._streams[sid] = _Stream()
        block = (
            b"\x83\x86"  # :method POST, :scheme http (static table)
            + _literal(b":path", path.encode())
            + _literal(b":authority", self._authority)
            + _literal(b"content-type", b"application/grpc")
            + _literal(b"te", b"trailers")
        )
        body = b"\x00" + _HEAD.pack(len(message)) + message
        self._transport.write(_frame(HEADERS, END_HEADERS, sid, block) + _frame(DATA, END_STREAM, sid, body))
        return stream

    async def messages_of(self, stream: _Stream) -> collections.abc.AsyncIterator[list[bytes]]:
        """Yield every message queued at once, until the stream ends."""
        loop = asyncio.get_running_loop()
        while True:
            if stream.messages:
                batch = list(stream.messages)
                stream.messages.clear()
                yield batch
                continue
            if stream.done:
                return
            stream.waiter = loop.create_future()
            await stream.waiter
            stream.waiter = None

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        pos = 0
        end = len(buf)
        woken: set[int] = set()
        while end - pos >= 9:
            length = int.from_bytes(buf[pos : pos + 3], "big")
            if end - pos < 9 + length:
                break
            kind = buf[pos + 3]
            flags = buf[pos + 4]
            sid = _HEAD.unpack_from(buf, pos + 5)[0] & 0x7FFFFFFF
            start = pos + 9
            pos = start + length
            if kind == DATA:
                self._received += length
                stream = self._streams.get(sid)
                if stream is not None:
                    payload = buf[start:pos]
                    if flags & PADDED:
                        payload = payload[1 : len(payload) - payload[0]]
                    pending = stream.pending
                    pending += payload
                    while len(pending) >= 5:
                        size = _HEAD.unpack_from(pending, 1)[0]
                        if len(pending) < 5 + size:
                            break
                        stream.messages.append(bytes(pending[5 : 5 + size]))
                        del pending[: 5 + size]
                        self.messages += 1
                    woken.add(sid)
                    if flags & END_STREAM:
                        stream.done = True
            elif kind == HEADERS:
                if flags & END_STREAM and (stream := self._streams.get(sid)) is not None:
                    stream.done = True  # trailers (grpc-status not decoded: see the module docstring)
                    woken.add(sid)
            elif kind == SETTINGS and not flags & ACK:
                self._write(_frame(SETTINGS, ACK, 0, b""))
            elif kind == PING and not flags & ACK:
                self._write(_frame(PING, ACK, 0, bytes(buf[start:pos])))
        del buf[:pos]
        if self._received >= WINDOW_REFILL:
            self._write(_frame(WINDOW_UPDATE, 0, 0, _HEAD.pack(self._received)))
            self._received = 0
        for sid in woken:
            stream = self._streams[sid]
            if stream.done:
                del self._streams[sid]
            if stream.waiter is not None and not stream.waiter.done():
                self.wakeups += 1
                stream.waiter.set_result(None)

    def _write(self, data: bytes) -> None:
        if self._transport is not None:
            self._transport.write(data)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


async def connect(host: str, port: int) -> H2GrpcConnection:
    loop = asyncio.get_running_loop()
    _, protocol = await loop.create_connection(lambda: H2GrpcConnection(f"{host}:{port}"), host, port)
    return protocol
