"""The server side of gRPC over HTTP/2 (RFC 9113, gRPC's PROTOCOL-HTTP2.md): bytes in, events and bytes out.

Sans-IO: no sockets, no clock, no tasks. `ServerConnection.receive_data` takes what the peer sent and returns
the calls that became ready (one request message, half-closed by the client) and the calls the client reset;
the `send_*` methods queue frames, and `data_to_send` hands them over. Only what the simulated engine's
services need: every call has exactly one request message (unary and server-streaming RPCs), no compression.

Invariants:
- Every resource a peer can make us hold is bounded: concurrent streams (SETTINGS_MAX_CONCURRENT_STREAMS,
  excess refused with RST_STREAM REFUSED_STREAM), a header block (``max_header_bytes``), a request message
  (``max_message_bytes``), one frame (``LOCAL_MAX_FRAME_SIZE``); what we queue for a stream beyond the peer's
  flow-control window is counted in `Stream.pending_bytes`, for the caller to pace its writes on.
- Header blocks are sent as literals without indexing, so we keep no HPACK dynamic-table state for the peer
  and a block's bytes can be reused.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import hpack

from node.workers import h2_frames as f
from node.workers.grpc_wire import MessageError, MessageReader

DEFAULT_MAX_CONCURRENT_STREAMS = 1024
DEFAULT_MAX_HEADER_BYTES = 16 * 1024
# What a client may send before we acknowledge: 1 MiB per stream and on the connection. Refilled at half.
LOCAL_WINDOW = 1 << 20

_PREFIX = struct.Struct(">BI")


def _unindexed(headers: list[tuple[str, str]]) -> bytes:
    encoder = hpack.Encoder()
    return bytes(encoder.encode([hpack.NeverIndexedHeaderTuple(k, v) for k, v in headers], huffman=False))


_RESPONSE_HEADERS = _unindexed([(":status", "200"), ("content-type", "application/grpc")])


# Request headers that are transport, not call metadata (grpc.aio leaves them out of invocation_metadata too).
_NOT_METADATA = frozenset(("content-type", "te", "grpc-timeout", "grpc-encoding", "grpc-accept-encoding", "user-agent"))


@dataclass(slots=True)
class Stream:
    id: int
    path: str = ""
    #: The call's metadata: request headers but pseudo-headers and transport ones (bounded by the header limit).
    metadata: tuple[tuple[str, str], ...] = ()
    reader: MessageReader | None = None
    messages: list[bytes] = field(default_factory=list)
    #: The client half-closed (END_STREAM): its request is complete.
    request_done: bool = False
    #: We sent response headers.
    headers_sent: bool = False
    #: We queued the trailers (or a reset): nothing more goes out on this stream.
    closed: bool = False
    send_window: int = 0
    #: DATA payloads waiting for flow-control window, in order.
    pending: list[bytes] = field(default_factory=list)
    pending_bytes: int = 0
    #: Trailers to send once ``pending`` drained.
    trailers: bytes | None = None
    recv_unacked: int = 0


@dataclass(frozen=True, slots=True)
class CallReady:
    """A call whose request arrived whole: ``message`` is its one request message."""

    stream_id: int
    path: str
    message: bytes
    metadata: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class CallError:
    """A call that cannot run (no request message, more than one, one too big, compressed): answer it with
    ``code`` and ``details`` and nothing else."""

    stream_id: int
    code: int
    details: str


@dataclass(frozen=True, slots=True)
class CallReset:
    """The client reset the stream (RST_STREAM): its handler should stop."""

    stream_id: int


@dataclass(frozen=True, slots=True)
class WindowOpened:
    """Queued data of ``stream_id`` went out (the peer opened its window): a writer pacing on it may go on."""

    stream_id: int


Event = CallReady | CallError | CallReset | WindowOpened


class ServerConnection:
    def __init__(
        self,
        *,
        max_message_bytes: int,
        max_concurrent_streams: int = DEFAULT_MAX_CONCURRENT_STREAMS,
        max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES,
    ) -> None:
        self._max_message = max_message_bytes
        self._max_streams = max_concurrent_streams
        self._max_header_bytes = max_header_bytes
        self._frames = f.FrameReader()
        self._decoder = hpack.Decoder()
        self._decoder.max_allowed_table_size = 4096  # the default we never change (no SETTINGS for it)
        self._decoder.max_header_list_size = max_header_bytes
        self._out: list[bytes] = []
        self._preface = b""
        self._preface_done = False
        self._streams: dict[int, Stream] = {}
        self._last_peer_stream = 0
        self._header_stream = 0
        self._header_block: bytearray | None = None
        self._header_end_stream = False
        self._peer_initial_window = f.DEFAULT_WINDOW
        self._peer_max_frame = f.DEFAULT_MAX_FRAME_SIZE
        self._send_window = f.DEFAULT_WINDOW  # the connection's
        self._recv_unacked = 0
        self._going_away = False
        #: Set once we sent GOAWAY for a protocol error: the caller closes the transport after flushing.
        self.failed: str | None = None
        self._out.append(
            f.settings_frame(
                {
                    f.SETTINGS_MAX_CONCURRENT_STREAMS: max_concurrent_streams,
                    f.SETTINGS_INITIAL_WINDOW_SIZE: LOCAL_WINDOW,
                    f.SETTINGS_MAX_FRAME_SIZE: f.LOCAL_MAX_FRAME_SIZE,
                    f.SETTINGS_MAX_HEADER_LIST_SIZE: max_header_bytes,
                }
            )
            + f.window_update_frame(0, LOCAL_WINDOW - f.DEFAULT_WINDOW)
        )

    # --- what the peer sends ---

    def receive_data(self, data: bytes) -> list[Event]:
        events: list[Event] = []
        if self.failed is not None:
            return events
        if not self._preface_done:
            self._preface += data
            if len(self._preface) < len(f.PREFACE):
                if not f.PREFACE.startswith(self._preface):
                    self._fail("not an HTTP/2 client preface", f.PROTOCOL_ERROR)
                return events
            if not self._preface.startswith(f.PREFACE):
                self._fail("not an HTTP/2 client preface", f.PROTOCOL_ERROR)
                return events
            data = self._preface[len(f.PREFACE) :]
            self._preface = b""
            self._preface_done = True
        try:
            for fr in self._frames.feed(data):
                self._on_frame(fr, events)
        except f.FrameError as exc:
            self._fail(str(exc), exc.code)
        if self._recv_unacked >= LOCAL_WINDOW // 2:
            self._out.append(f.window_update_frame(0, self._recv_unacked))
            self._recv_unacked = 0
        return events

    def _fail(self, reason: str, code: int) -> None:
        self.failed = reason
        self._out.append(f.goaway_frame(self._last_peer_stream, code))

    def _on_frame(self, fr: f.Frame, events: list[Event]) -> None:
        kind = fr.kind
        if self._header_block is not None and (kind != f.CONTINUATION or fr.stream_id != self._header_stream):
            raise f.FrameError("a header block was interrupted by another frame")
        if kind == f.DATA:
            self._on_data(fr, events)
        elif kind == f.HEADERS:
            self._on_headers(fr, events)
        elif kind == f.CONTINUATION:
            if self._header_block is None:
                raise f.FrameError("CONTINUATION without a header block")
            self._add_header_fragment(fr.payload)
            if fr.flags & f.FLAG_END_HEADERS:
                self._end_header_block(events)
        elif kind == f.SETTINGS:
            self._on_settings(fr, events)
        elif kind == f.WINDOW_UPDATE:
            self._on_window_update(fr, events)
        elif kind == f.PING:
            if len(fr.payload) != 8:
                raise f.FrameError("PING payload is not 8 bytes", f.FRAME_SIZE_ERROR)
            if not fr.flags & f.FLAG_ACK:
                self._out.append(f.frame(f.PING, f.FLAG_ACK, 0, fr.payload))
        elif kind == f.RST_STREAM:
            f.parse_u32(fr.payload, "RST_STREAM")
            stream = self._streams.pop(fr.stream_id, None)
            if stream is not None:
                stream.closed = True
                events.append(CallReset(stream.id))
        elif kind == f.GOAWAY:
            f.parse_goaway(fr.payload)  # the client goes away: its open calls still finish
        elif kind == f.PUSH_PROMISE:
            raise f.FrameError("a client sent PUSH_PROMISE")
        # PRIORITY and unknown frame types are ignored (§5.3.2, §4.1).

    def _on_headers(self, fr: f.Frame, events: list[Event]) -> None:
        sid = fr.stream_id
        if sid == 0 or sid % 2 == 0:
            raise f.FrameError("HEADERS on stream 0 or a server stream id")
        payload = f.strip_padding(fr.flags, fr.payload)
        if fr.flags & f.FLAG_PRIORITY:
            if len(payload) < 5:
                raise f.FrameError("HEADERS priority field truncated", f.FRAME_SIZE_ERROR)
            payload = payload[5:]
        self._header_stream = sid
        self._header_block = bytearray()
        self._header_end_stream = bool(fr.flags & f.FLAG_END_STREAM)
        self._add_header_fragment(payload)
        if fr.flags & f.FLAG_END_HEADERS:
            self._end_header_block(events)

    def _add_header_fragment(self, payload: bytes) -> None:
        block = self._header_block
        assert block is not None
        block += payload
        if len(block) > self._max_header_bytes:
            raise f.FrameError(f"a header block over {self._max_header_bytes} bytes", f.ENHANCE_YOUR_CALM)

    def _end_header_block(self, events: list[Event]) -> None:
        block, sid, end_stream = self._header_block, self._header_stream, self._header_end_stream
        self._header_block = None
        assert block is not None
        try:
            headers = self._decoder.decode(bytes(block), raw=False)
        except hpack.HPACKError as exc:
            raise f.FrameError(f"undecodable header block: {exc}", f.COMPRESSION_ERROR) from None
        stream = self._streams.get(sid)
        if stream is not None:  # trailers from the client: its request is over
            if end_stream:
                self._request_complete(stream, events)
            return
        if sid <= self._last_peer_stream:
            return  # a stream we already closed (reset, refused): ignore what is late
        self._last_peer_stream = sid
        if self._going_away or len(self._streams) >= self._max_streams:
            self._out.append(f.rst_stream_frame(sid, f.REFUSED_STREAM))
            return
        fields: list[tuple[Any, Any]] = list(headers)  # str pairs (raw=False); the stubs say bytes
        path = next((str(value) for name, value in fields if name == ":path"), "")
        metadata = tuple(
            (str(name), str(value)) for name, value in fields if not name.startswith(":") and name not in _NOT_METADATA
        )
        stream = Stream(sid, path, metadata, MessageReader(self._max_message), send_window=self._peer_initial_window)
        self._streams[sid] = stream
        if end_stream:
            self._request_complete(stream, events)

    def _on_data(self, fr: f.Frame, events: list[Event]) -> None:
        sid = fr.stream_id
        if sid == 0:
            raise f.FrameError("DATA on stream 0")
        size = len(fr.payload)
        self._recv_unacked += size
        stream = self._streams.get(sid)
        if stream is None or stream.request_done:
            return  # reset or finished: the bytes still count against the connection window (refilled above)
        stream.recv_unacked += size
        if stream.recv_unacked >= LOCAL_WINDOW // 2:
            self._out.append(f.window_update_frame(sid, stream.recv_unacked))
            stream.recv_unacked = 0
        reader = stream.reader
        assert reader is not None
        try:
            reader.feed(f.strip_padding(fr.flags, fr.payload), stream.messages)
        except MessageError as exc:
            self._refuse(stream, 8, str(exc), events)  # RESOURCE_EXHAUSTED
            return
        if len(stream.messages) > 1:
            self._refuse(stream, 12, "this server takes one request message per call", events)  # UNIMPLEMENTED
            return
        if fr.flags & f.FLAG_END_STREAM:
            self._request_complete(stream, events)

    def _refuse(self, stream: Stream, code: int, details: str, events: list[Event]) -> None:
        stream.request_done = True
        stream.reader = None
        stream.messages = []
        events.append(CallError(stream.id, code, details))

    def _request_complete(self, stream: Stream, events: list[Event]) -> None:
        if stream.request_done:
            return
        stream.request_done = True
        reader, stream.reader = stream.reader, None
        if reader is not None and reader.partial:
            events.append(CallError(stream.id, 13, "the request ended inside a message"))  # INTERNAL
        elif len(stream.messages) != 1:
            events.append(CallError(stream.id, 12, "this server takes exactly one request message per call"))
        else:
            events.append(CallReady(stream.id, stream.path, stream.messages.pop(), stream.metadata))

    def _on_settings(self, fr: f.Frame, events: list[Event]) -> None:
        if fr.stream_id != 0:
            raise f.FrameError("SETTINGS on a stream")
        if fr.flags & f.FLAG_ACK:
            return
        for key, value in f.parse_settings(fr.payload):
            if key == f.SETTINGS_INITIAL_WINDOW_SIZE:
                if value > f.MAX_WINDOW:
                    raise f.FrameError("initial window above 2^31-1", f.FLOW_CONTROL_ERROR)
                delta = value - self._peer_initial_window
                self._peer_initial_window = value
                for stream in self._streams.values():
                    stream.send_window += delta
                    if delta > 0:
                        self._drain(stream, events)
            elif key == f.SETTINGS_MAX_FRAME_SIZE:
                if not f.DEFAULT_MAX_FRAME_SIZE <= value <= 2**24 - 1:
                    raise f.FrameError("SETTINGS_MAX_FRAME_SIZE out of range")
                self._peer_max_frame = value
            elif key == f.SETTINGS_HEADER_TABLE_SIZE:
                pass  # we never index: the size of the peer's decoder table does not matter to us
        self._out.append(f.frame(f.SETTINGS, f.FLAG_ACK, 0))

    def _on_window_update(self, fr: f.Frame, events: list[Event]) -> None:
        increment = f.parse_u32(fr.payload, "WINDOW_UPDATE")
        if increment == 0:
            raise f.FrameError("WINDOW_UPDATE of 0")
        if fr.stream_id == 0:
            self._send_window += increment
            if self._send_window > f.MAX_WINDOW:
                raise f.FrameError("connection window above 2^31-1", f.FLOW_CONTROL_ERROR)
            for stream in list(self._streams.values()):
                if self._send_window <= 0:
                    break
                self._drain(stream, events)
            return
        target = self._streams.get(fr.stream_id)
        if target is not None:
            target.send_window += increment
            self._drain(target, events)

    # --- what the caller sends ---

    def stream(self, stream_id: int) -> Stream | None:
        return self._streams.get(stream_id)

    def send_message(self, stream_id: int, message: bytes) -> int:
        """Queue one response message (response headers first if not yet sent). Returns the bytes of this
        stream still waiting for the peer's window (0: all of it went out); 0 for a stream no longer open."""
        stream = self._streams.get(stream_id)
        if stream is None or stream.closed:
            return 0
        if not stream.headers_sent:
            self.send_headers(stream_id)
        payload = _PREFIX.pack(0, len(message)) + message
        size = len(payload)
        if (
            not stream.pending
            and size <= stream.send_window
            and size <= self._send_window
            and size <= self._peer_max_frame
        ):
            stream.send_window -= size
            self._send_window -= size
            self._out.append(f.frame(f.DATA, 0, stream_id, payload))
            return 0
        stream.pending.append(payload)
        stream.pending_bytes += size
        self._drain(stream, None)
        return stream.pending_bytes

    def send_headers(self, stream_id: int) -> None:
        stream = self._streams.get(stream_id)
        if stream is None or stream.headers_sent or stream.closed:
            return
        stream.headers_sent = True
        self._out.append(f.frame(f.HEADERS, f.FLAG_END_HEADERS, stream_id, _RESPONSE_HEADERS))

    def send_trailers(self, stream_id: int, code: int, details: str = "") -> None:
        """End the call with status ``code``: after the messages still queued, or as a trailers-only response
        when none were sent."""
        stream = self._streams.get(stream_id)
        if stream is None or stream.closed:
            return
        stream.closed = True
        fields = [("grpc-status", str(code))]
        if details:
            fields.append(("grpc-message", _percent_encode(details)))
        if not stream.headers_sent:
            stream.headers_sent = True
            block = _unindexed([(":status", "200"), ("content-type", "application/grpc"), *fields])
        else:
            block = _unindexed(fields)
        stream.trailers = block
        self._drain(stream, None)

    def reset(self, stream_id: int, code: int = f.CANCEL) -> None:
        stream = self._streams.pop(stream_id, None)
        if stream is not None:
            stream.closed = True
            self._out.append(f.rst_stream_frame(stream_id, code))

    def go_away(self) -> None:
        """Take no new calls (GOAWAY NO_ERROR naming the last stream the peer opened); open ones go on."""
        if not self._going_away and self.failed is None:
            self._going_away = True
            self._out.append(f.goaway_frame(self._last_peer_stream, f.NO_ERROR))

    def data_to_send(self) -> bytes:
        out = b"".join(self._out)
        self._out.clear()
        return out

    @property
    def active(self) -> int:
        return len(self._streams)

    def _drain(self, stream: Stream, events: list[Event] | None) -> None:
        """Send what the windows allow of ``stream``'s queued data, then its trailers once nothing is queued."""
        pending = stream.pending
        was = stream.pending_bytes
        while pending:
            head = pending[0]
            room = min(stream.send_window, self._send_window, self._peer_max_frame)
            if room <= 0:
                break
            piece, rest = head[:room], head[room:]
            stream.send_window -= len(piece)
            self._send_window -= len(piece)
            stream.pending_bytes -= len(piece)
            self._out.append(f.frame(f.DATA, 0, stream.id, piece))
            if rest:
                pending[0] = rest
            else:
                pending.pop(0)
        if not pending and stream.trailers is not None:
            self._out.append(_headers_frames(stream.id, stream.trailers, self._peer_max_frame))
            stream.trailers = None
            self._streams.pop(stream.id, None)
        if events is not None and was and not stream.pending_bytes:
            events.append(WindowOpened(stream.id))


def _headers_frames(stream_id: int, block: bytes, max_frame: int) -> bytes:
    """HEADERS (END_STREAM) then CONTINUATIONs: a block larger than one frame is split (§6.10)."""
    if len(block) <= max_frame:
        return f.frame(f.HEADERS, f.FLAG_END_STREAM | f.FLAG_END_HEADERS, stream_id, block)
    parts = [block[i : i + max_frame] for i in range(0, len(block), max_frame)]
    out = [f.frame(f.HEADERS, f.FLAG_END_STREAM, stream_id, parts[0])]
    out += [f.frame(f.CONTINUATION, 0, stream_id, p) for p in parts[1:-1]]
    out.append(f.frame(f.CONTINUATION, f.FLAG_END_HEADERS, stream_id, parts[-1]))
    return b"".join(out)


_UNRESERVED = frozenset(
    b" !\"#$&'()*+,-./0123456789:;<=>?@ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrstuvwxyz{|}~"
)


def _percent_encode(text: str) -> str:
    """grpc-message is percent-encoded UTF-8: printable ASCII except '%' as it is (PROTOCOL-HTTP2.md)."""
    return "".join(chr(b) if b in _UNRESERVED else f"%{b:02X}" for b in text.encode("utf-8"))
