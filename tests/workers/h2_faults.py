"""Fault workers for the h2 transport's tests: a TCP relay that can go silent (a half-open connection: the peer
vanished without FIN or RST), and a tiny HTTP/2 gRPC server that sends GOAWAY when told to."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import hpack

from node.workers import h2_frames as f
from node.workers.grpc_wire import MessageReader, encode_message


class FreezableProxy:
    """Relays TCP to ``target_port``; ``freeze()`` stops relaying either way but keeps every socket open, as
    a peer whose host vanished (or was SIGSTOPped) would look from our side."""

    def __init__(self, target_port: int) -> None:
        self._target_port = target_port
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.frozen = asyncio.Event()
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def freeze(self) -> None:
        self.frozen.set()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._target_port)
        self._writers += [writer, up_writer]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await src.read(65536):
                    if self.frozen.is_set():
                        await asyncio.Event().wait()  # swallow everything from now on, close nothing
                    dst.write(data)

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    async def close(self) -> None:
        for writer in self._writers:
            writer.transport.abort()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


@dataclass(slots=True)
class H2Conn:
    """One accepted connection of ``GoawayServer``: the streams it saw, and a way to write frames."""

    index: int
    writer: asyncio.StreamWriter
    streams: list[int] = field(default_factory=list)
    encoder: hpack.Encoder = field(default_factory=hpack.Encoder)

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    def respond(self, stream_id: int, message: bytes, *, end: bool = True) -> None:
        """Response headers (first call per stream), one message, and with ``end`` OK trailers."""
        self.headers(stream_id, [(":status", "200"), ("content-type", "application/grpc")])
        self.send(f.frame(f.DATA, 0, stream_id, encode_message(message)))
        if end:
            self.end(stream_id)

    def headers(self, stream_id: int, fields: list[tuple[str, str]], *, end: bool = False) -> None:
        flags = f.FLAG_END_HEADERS | (f.FLAG_END_STREAM if end else 0)
        self.send(f.frame(f.HEADERS, flags, stream_id, self.encoder.encode(fields)))

    def more(self, stream_id: int, message: bytes) -> None:
        self.send(f.frame(f.DATA, 0, stream_id, encode_message(message)))

    def end(self, stream_id: int) -> None:
        self.headers(stream_id, [("grpc-status", "0")], end=True)

    def goaway(self, last_stream_id: int) -> None:
        self.send(f.goaway_frame(last_stream_id, f.NO_ERROR))


#: Called for every request: (connection, stream id, request message). It answers through the connection.
OnRequest = Callable[[H2Conn, int, bytes], Awaitable[None]]
#: Called for every PING received: (connection, payload). It sends the ACK (``ack``) when it likes.
OnPing = Callable[[H2Conn, bytes], None]


def ack(conn: H2Conn, payload: bytes) -> None:
    conn.send(f.frame(f.PING, f.FLAG_ACK, 0, payload))


class GoawayServer:
    """A minimal HTTP/2 gRPC server: SETTINGS, PING ACKs, and ``on_request`` for each complete request."""

    def __init__(self, on_request: OnRequest, on_ping: OnPing = ack) -> None:
        self._on_request = on_request
        self._on_ping = on_ping
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.conns: list[H2Conn] = []
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = H2Conn(len(self.conns), writer)
        self.conns.append(conn)
        await reader.readexactly(len(f.PREFACE))
        conn.send(f.settings_frame({}))
        frames = f.FrameReader()
        decoder = hpack.Decoder()
        bodies: dict[int, MessageReader] = {}
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await reader.read(65536):
                for fr in frames.feed(data):
                    if fr.kind == f.SETTINGS and not fr.flags & f.FLAG_ACK:
                        conn.send(f.frame(f.SETTINGS, f.FLAG_ACK, 0))
                    elif fr.kind == f.PING and not fr.flags & f.FLAG_ACK:
                        self._on_ping(conn, fr.payload)
                    elif fr.kind == f.HEADERS:
                        decoder.decode(fr.payload)
                        conn.streams.append(fr.stream_id)
                        bodies[fr.stream_id] = MessageReader(1 << 20)
                    elif fr.kind == f.DATA and fr.stream_id in bodies:
                        messages: list[bytes] = []
                        bodies[fr.stream_id].feed(fr.payload, messages)
                        for message in messages:
                            task = asyncio.create_task(self._on_request(conn, fr.stream_id, message))
                            self._tasks.add(task)
                            task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for conn in self.conns:
            conn.writer.transport.abort()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
