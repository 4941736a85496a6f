"""The client side of one HTTP/2 connection carrying gRPC calls with a single request message: sans-IO.

Bytes in (``receive_data``), bytes out (``data_to_send``); the caller owns the socket and the clock. Each call
is a ``Stream`` whose response messages, status and end are filled in as frames arrive; ``receive_data``
returns the streams it changed so the caller wakes only their readers.

Invariants:
- the peer's flow-control windows are never overrun: a request body larger than the windows is sent as they
  open (WINDOW_UPDATE), in frames no larger than the peer's SETTINGS_MAX_FRAME_SIZE;
- no stream is opened beyond the peer's SETTINGS_MAX_CONCURRENT_STREAMS (``can_open``);
- our receive windows are kept near their maximum: a Generate response is bounded by max_tokens and its
  reader is the gateway's own event loop, so flow control is not used as backpressure here;
- a stream ends exactly once, with a status; a connection-level failure ends every open stream;
- liveness is the caller's (it owns the clock, ``h2_keepalive``): the core sends the PINGs it is told to,
  and counts what arrives (``frames_received``, ``data_frames_received``, ``take_ping_acks``);
- a header block is served from the connection's cache only when decoding it is a pure function of its bytes
  (``_decode``): the same fields and the same HPACK state as decoding it again.
"""

from __future__ import annotations

import hpack

from node.workers import h2_frames as f
from node.workers.grpc_wire import (
    CANCELLED,
    INTERNAL,
    OK,
    UNAVAILABLE,
    GrpcStatus,
    MessageError,
    MessageReader,
    status_of,
)

_DATA = f.DATA
_FLAG_PADDED = f.FLAG_PADDED
_FLAG_END_STREAM = f.FLAG_END_STREAM
_GRPC_PREFIX_SIZE = f.GRPC_PREFIX_SIZE

#: Receive windows are topped up once this much was consumed from them (a quarter of 2 GiB: rare updates).
WINDOW_REFILL = 1 << 29
#: A response's header block, as received (HEADERS plus its CONTINUATIONs), is held until it ends: bounded like
#: the decoded list (hpack's default max_header_list_size, 64 KiB), so a worker cannot make us buffer without end.
MAX_HEADER_BLOCK_BYTES = 64 * 1024
_RST_STATUS = {f.REFUSED_STREAM: UNAVAILABLE, f.CANCEL: CANCELLED}
#: Decoded header blocks a connection keeps, by their bytes. Bounded because the keys are whatever the worker
#: sends (a grpc-message that differs per call would grow it forever); cleared when full. A Generate call's
#: headers and trailers are a handful of distinct blocks, so the clearing is rare.
HEADER_CACHE_ENTRIES = 256
#: Longer blocks are decoded every time: the cache's memory stays below entries x this (plus their fields).
HEADER_CACHE_MAX_BLOCK = 1024

#: A decoded header block: its fields, and its :status as a number (0 when absent or not a number).
_Decoded = tuple[tuple[tuple[str, str], ...], int]


class Stream:
    """One call. ``messages`` collects whole response messages until the reader takes them."""

    __slots__ = (
        "_body",
        "_reader",
        "_recv_unacked",
        "_send_window",
        "ended",
        "http_status",
        "id",
        "messages",
        "status",
        "unprocessed",
    )

    def __init__(self, stream_id: int, body: bytes, send_window: int, max_message_bytes: int) -> None:
        self.id = stream_id
        self.messages: list[bytes] = []
        self.http_status: int | None = None
        self.status: GrpcStatus | None = None  # set when the stream ended
        self.ended = False
        #: The peer refused the stream (REFUSED_STREAM, or above a GOAWAY's last stream id): it never reached
        #: the application, so the call may be sent again.
        self.unprocessed = False
        self._reader = MessageReader(max_message_bytes)
        self._body = memoryview(body)  # request bytes not yet sent
        self._send_window = send_window
        self._recv_unacked = 0


class H2Connection:
    """One client connection. Call ``initiate`` first; ``ready`` once the peer's first SETTINGS arrived."""

    def __init__(self, max_message_bytes: int) -> None:
        self._max_message_bytes = max_message_bytes
        self._out: list[bytes] = []
        self._frames = f.FrameReader()
        # max_allowed_table_size stays at the default 4096 although we advertise 0: a peer that ignores the
        # setting is still decoded (it only misses the cache).
        self._decoder = hpack.Decoder()
        self._header_cache: dict[tuple[int, bytes], _Decoded] = {}
        #: Header blocks served from the cache instead of decoded (monotonic).
        self.header_cache_hits = 0
        self._streams: dict[int, Stream] = {}
        self._blocked: dict[int, Stream] = {}  # streams with request bytes waiting for window
        self._next_id = 1
        self._send_window = f.DEFAULT_WINDOW
        self._peer_initial_window = f.DEFAULT_WINDOW
        self._peer_max_frame = f.DEFAULT_MAX_FRAME_SIZE
        self._peer_max_streams = f.MAX_STREAM_ID  # unlimited until the peer says otherwise
        self._recv_unacked = 0
        self._header_block: bytearray | None = None  # a HEADERS block waiting for its CONTINUATIONs
        self._header_stream = 0
        self._header_end_stream = False
        self.ready = False
        self.goaway = False
        #: Frames of any kind, and DATA/HEADERS frames (the ones after which a gRPC server forgives pings), so
        #: far; monotonic counters the caller compares.
        self.frames_received = 0
        self.data_frames_received = 0
        self._ping_acks: list[bytes] = []
        #: Why this connection takes no more calls and has none left: set by a connection error or loss.
        self.closed: GrpcStatus | None = None

    # --- what the caller asks ---

    def initiate(self) -> None:
        self._out.append(
            f.PREFACE
            + f.settings_frame(
                {
                    # No HPACK dynamic table: the peer's header blocks are then the same bytes call after
                    # call, which ``_decode`` serves from its cache.
                    f.SETTINGS_HEADER_TABLE_SIZE: 0,
                    f.SETTINGS_ENABLE_PUSH: 0,
                    f.SETTINGS_INITIAL_WINDOW_SIZE: f.MAX_WINDOW,
                    f.SETTINGS_MAX_FRAME_SIZE: f.LOCAL_MAX_FRAME_SIZE,
                }
            )
            + f.window_update_frame(0, f.MAX_WINDOW - f.DEFAULT_WINDOW)
        )

    def data_to_send(self) -> bytes:
        out = b"".join(self._out)
        self._out.clear()
        return out

    @property
    def active(self) -> int:
        return len(self._streams)

    @property
    def accepting(self) -> bool:
        """New calls may still go on this connection (no GOAWAY, not closed, stream ids left)."""
        return self.closed is None and not self.goaway and self._next_id <= f.MAX_STREAM_ID

    @property
    def free_streams(self) -> int:
        """Streams that may still be opened before the peer's concurrency limit."""
        return max(0, self._peer_max_streams - len(self._streams))

    def can_open(self) -> bool:
        return self.accepting and len(self._streams) < self._peer_max_streams

    def open_stream(self, header_block: bytes, body: bytes) -> Stream:
        """Send HEADERS (an HPACK block without dynamic-table state) and as much of ``body`` as the windows
        allow. Raises RuntimeError when ``can_open`` is false (the caller queues)."""
        if not self.can_open():
            raise RuntimeError("no stream can be opened on this connection now")
        sid = self._next_id
        self._next_id += 2
        stream = self._streams[sid] = Stream(sid, body, self._peer_initial_window, self._max_message_bytes)
        self._out.append(f.frame(f.HEADERS, f.FLAG_END_HEADERS, sid, header_block))
        self._send_body(stream)
        return stream

    def send_ping(self, payload: bytes) -> None:
        """Send PING with an 8-byte ``payload``; its ACK shows up in ``take_ping_acks``."""
        self._out.append(f.frame(f.PING, 0, 0, payload))

    def take_ping_acks(self) -> list[bytes]:
        """The payloads of PING ACKs received since the last call."""
        acks, self._ping_acks = self._ping_acks, []
        return acks

    def cancel_stream(self, stream: Stream) -> None:
        """The reader left before the end: RST_STREAM(CANCEL); the stream ends CANCELLED."""
        if stream.ended:
            return
        self._out.append(f.rst_stream_frame(stream.id, f.CANCEL))
        self._end(stream, GrpcStatus(CANCELLED, "cancelled by the client"))

    def connection_lost(self, reason: str) -> list[Stream]:
        """The socket closed: every open stream ends UNAVAILABLE. Returns them."""
        if self.closed is None:
            self.closed = GrpcStatus(UNAVAILABLE, reason)
        return self._fail_all(self.closed)

    # --- what the peer sends ---

    def receive_data(self, data: bytes) -> list[Stream]:
        """Process received bytes; the streams that got messages or ended, each once, in order."""
        changed: dict[int, Stream] = {}
        if self.closed is not None:
            return []
        try:
            frames = self._frames.feed_messages(data, self._max_message_bytes)
            # Counted per read, not per frame (the keepalive only asks whether anything arrived).
            self.frames_received += len(frames)
            streams = self._streams
            for fr in frames:
                if not isinstance(fr, f.Frame):  # a DATA frame of one whole message: a streamed token, the hot kind
                    sid, message = fr
                    stream = streams.get(sid)
                    if (
                        stream is None
                        or stream.http_status is None
                        or self._header_block is not None
                        or stream._reader.partial
                    ):  # an unknown or reset stream, an interrupted header block, a message already begun
                        self._receive_frame(f.Frame(_DATA, 0, sid, f.grpc_prefixed(message)), changed)
                        continue
                    self.data_frames_received += 1
                    size = len(message) + _GRPC_PREFIX_SIZE
                    self._recv_unacked += size
                    stream._recv_unacked += size
                    if stream._recv_unacked >= WINDOW_REFILL:
                        self._out.append(f.window_update_frame(sid, stream._recv_unacked))
                        stream._recv_unacked = 0
                    stream.messages.append(message)
                    changed[sid] = stream
                elif fr.kind == _DATA and self._header_block is None:
                    self._on_data(fr, changed)
                else:
                    self._receive_frame(fr, changed)
        except f.FrameError as exc:
            self._out.append(f.goaway_frame(self._next_id - 2 if self._next_id > 1 else 0, exc.code))
            self.closed = GrpcStatus(INTERNAL, f"HTTP/2 protocol error from the worker: {exc}")
            for stream in self._fail_all(self.closed):
                changed[stream.id] = stream
        if self._recv_unacked >= WINDOW_REFILL:
            self._out.append(f.window_update_frame(0, self._recv_unacked))
            self._recv_unacked = 0
        return list(changed.values())

    def _receive_frame(self, fr: f.Frame, changed: dict[int, Stream]) -> None:
        kind = fr.kind
        if self._header_block is not None and (kind != f.CONTINUATION or fr.stream_id != self._header_stream):
            raise f.FrameError("a header block was interrupted by another frame")
        if kind == _DATA:
            self._on_data(fr, changed)
        elif kind in (f.HEADERS, f.CONTINUATION):
            self._on_headers(fr, changed)
        elif kind == f.SETTINGS:
            self._on_settings(fr)
        elif kind == f.WINDOW_UPDATE:
            self._on_window_update(fr)
        elif kind == f.PING:
            if len(fr.payload) != 8:
                raise f.FrameError("PING payload is not 8 bytes", f.FRAME_SIZE_ERROR)
            if fr.flags & f.FLAG_ACK:
                self._ping_acks.append(fr.payload)
            else:
                self._out.append(f.frame(f.PING, f.FLAG_ACK, 0, fr.payload))
        elif kind == f.RST_STREAM:
            code = f.parse_u32(fr.payload, "RST_STREAM")
            stream = self._streams.get(fr.stream_id)
            if stream is not None:
                stream.unprocessed = code == f.REFUSED_STREAM and stream.http_status is None
                status = GrpcStatus(
                    _RST_STATUS.get(code, INTERNAL), f"stream reset by the worker (HTTP/2 error {code})"
                )
                self._end(stream, status, reset=False)
                changed[stream.id] = stream
        elif kind == f.GOAWAY:
            self._on_goaway(fr, changed)
        elif kind == f.PUSH_PROMISE:
            raise f.FrameError("PUSH_PROMISE although push is disabled")
        # PRIORITY and unknown frame types are ignored (RFC 9113 §5.5).

    def _on_data(self, fr: f.Frame, changed: dict[int, Stream]) -> None:
        self.data_frames_received += 1
        size = len(fr.payload)
        self._recv_unacked += size  # the connection window counts every DATA byte, padding included
        stream = self._streams.get(fr.stream_id)
        if stream is None or stream.http_status is None:
            if fr.stream_id == 0 or fr.stream_id >= self._next_id:
                raise f.FrameError(f"DATA on stream {fr.stream_id}, which was never opened")
            if stream is not None:
                raise f.FrameError(f"DATA before HEADERS on stream {fr.stream_id}")
            return  # a stream we reset: its late frames still count for the connection window
        stream._recv_unacked += size
        if stream._recv_unacked >= WINDOW_REFILL:
            self._out.append(f.window_update_frame(stream.id, stream._recv_unacked))
            stream._recv_unacked = 0
        flags = fr.flags
        payload = fr.payload if not flags & _FLAG_PADDED else f.strip_padding(flags, fr.payload)
        try:
            stream._reader.feed(payload, stream.messages)
        except MessageError as exc:
            self._out.append(f.rst_stream_frame(stream.id, f.CANCEL))
            self._end(stream, GrpcStatus(INTERNAL, str(exc)))
            changed[stream.id] = stream
            return
        if flags & _FLAG_END_STREAM:
            self._end(stream, self._final_status(stream, None))
        changed[stream.id] = stream

    def _on_headers(self, fr: f.Frame, changed: dict[int, Stream]) -> None:
        if fr.kind == f.HEADERS:
            self.data_frames_received += 1
            if fr.stream_id == 0:
                raise f.FrameError("HEADERS on stream 0")
            payload = f.strip_padding(fr.flags, fr.payload)
            if fr.flags & f.FLAG_PRIORITY:
                payload = payload[5:]
            self._header_block = bytearray(payload)
            self._header_stream = fr.stream_id
            self._header_end_stream = bool(fr.flags & f.FLAG_END_STREAM)
        else:
            if self._header_block is None:
                raise f.FrameError("CONTINUATION without HEADERS")
            self._header_block += fr.payload
        if len(self._header_block) > MAX_HEADER_BLOCK_BYTES:
            raise f.FrameError(
                f"a header block of more than {MAX_HEADER_BLOCK_BYTES} bytes (HEADERS and CONTINUATION frames)",
                f.ENHANCE_YOUR_CALM,
            )
        if not fr.flags & f.FLAG_END_HEADERS:
            return
        block, self._header_block = bytes(self._header_block), None
        fields, http_status = self._decode(block)  # even for a stream we reset: the HPACK state is the connection's
        stream = self._streams.get(self._header_stream)
        if stream is None:
            return
        if stream.http_status is None:  # response headers (or a trailers-only response)
            stream.http_status = http_status
            if self._header_end_stream:
                self._end(stream, self._final_status(stream, fields))
                changed[stream.id] = stream
            return
        if not self._header_end_stream:
            raise f.FrameError(f"trailers without END_STREAM on stream {stream.id}")
        self._end(stream, self._final_status(stream, fields))
        changed[stream.id] = stream

    def _decode(self, block: bytes) -> _Decoded:
        """Decode a complete header block, from the cache when that is provably the same.

        Cache invariant: every entry, keyed by the table's max size and the block, was decoded from an empty
        dynamic table of that max size and left it empty with the same max size. From that state decoding reads
        nothing but the bytes (besides the static table and the decoder's limits, which this connection never
        changes; ``resized`` is only the encoder's), so while the table is in that state a hit is exactly what
        decoding would give, state transition (none) included. That covers a peer that honours our
        SETTINGS_HEADER_TABLE_SIZE 0 (grpc-core) and one that never indexes a field and never sends a size
        update (its table stays empty at 4096, as with our simulated worker's server). Blocks that fail are not
        stored (the connection dies with them). A peer that indexes fields is just decoded every time.
        """
        decoder = self._decoder
        table = decoder.header_table
        size = decoder.header_table_size
        empty = not table.dynamic_entries
        if empty:
            hit = self._header_cache.get((size, block))
            if hit is not None:
                self.header_cache_hits += 1
                return hit
        try:
            headers = decoder.decode(block)
        except hpack.HPACKError as exc:
            raise f.FrameError(f"undecodable header block: {exc}", f.COMPRESSION_ERROR) from exc
        fields = tuple((str(k), str(v)) for k, v in headers)
        raw = dict(fields).get(":status", "")
        decoded = (fields, int(raw) if raw.isascii() and raw.isdigit() else 0)  # isdigit alone passes "²"
        if (
            empty
            and decoder.header_table_size == size
            and not table.dynamic_entries
            and len(block) <= HEADER_CACHE_MAX_BLOCK
        ):
            if len(self._header_cache) >= HEADER_CACHE_ENTRIES:
                self._header_cache.clear()
            self._header_cache[(size, block)] = decoded
        return decoded

    def _final_status(self, stream: Stream, trailers: tuple[tuple[str, str], ...] | None) -> GrpcStatus:
        status = status_of(trailers or (), http_status=stream.http_status)
        if status is None:
            return GrpcStatus(INTERNAL, "the worker ended the stream without a grpc-status")
        if status.code == OK and stream._reader.partial:
            return GrpcStatus(INTERNAL, "the worker ended the stream inside a message")
        return status

    def _on_settings(self, fr: f.Frame) -> None:
        if fr.stream_id != 0:
            raise f.FrameError("SETTINGS on a stream")
        if fr.flags & f.FLAG_ACK:
            return
        for key, value in f.parse_settings(fr.payload):
            if key == f.SETTINGS_MAX_CONCURRENT_STREAMS:
                self._peer_max_streams = value
            elif key == f.SETTINGS_INITIAL_WINDOW_SIZE:
                if value > f.MAX_WINDOW:
                    raise f.FrameError("SETTINGS_INITIAL_WINDOW_SIZE above 2^31-1", f.FLOW_CONTROL_ERROR)
                delta = value - self._peer_initial_window
                self._peer_initial_window = value
                for stream in self._streams.values():  # §6.9.2: open streams' windows move by the change
                    stream._send_window += delta
            elif key == f.SETTINGS_MAX_FRAME_SIZE:
                if not f.DEFAULT_MAX_FRAME_SIZE <= value <= (1 << 24) - 1:
                    raise f.FrameError(f"SETTINGS_MAX_FRAME_SIZE {value} out of range")
                self._peer_max_frame = value
        self._out.append(f.frame(f.SETTINGS, f.FLAG_ACK, 0))
        self.ready = True
        self._send_blocked()

    def _on_window_update(self, fr: f.Frame) -> None:
        increment = f.parse_u32(fr.payload, "WINDOW_UPDATE")
        if fr.stream_id == 0:
            if increment == 0:
                raise f.FrameError("WINDOW_UPDATE of 0 on the connection")
            self._send_window += increment
            if self._send_window > f.MAX_WINDOW:
                raise f.FrameError("connection window above 2^31-1", f.FLOW_CONTROL_ERROR)
        else:
            stream = self._streams.get(fr.stream_id)
            if stream is None:
                return  # a closed stream: allowed, ignored
            stream._send_window += increment
            if increment == 0 or stream._send_window > f.MAX_WINDOW:
                self._out.append(f.rst_stream_frame(stream.id, f.FLOW_CONTROL_ERROR))
                self._end(stream, GrpcStatus(INTERNAL, "the worker broke flow control"))
                return
        self._send_blocked()

    def _on_goaway(self, fr: f.Frame, changed: dict[int, Stream]) -> None:
        last, code, debug = f.parse_goaway(fr.payload)
        self.goaway = True
        reason = f"the worker is closing the connection (GOAWAY, HTTP/2 error {code}"
        reason += f", {debug.decode(errors='replace')})" if debug else ")"
        for stream in [s for s in self._streams.values() if s.id > last]:  # never processed: safe to retry
            stream.unprocessed = True
            self._end(stream, GrpcStatus(UNAVAILABLE, reason))
            changed[stream.id] = stream

    # --- internals ---

    def _send_body(self, stream: Stream) -> None:
        body = stream._body
        while body:
            size = min(len(body), self._send_window, stream._send_window, self._peer_max_frame)
            if size <= 0:
                self._blocked[stream.id] = stream
                break
            last = size == len(body)
            self._out.append(f.frame(f.DATA, f.FLAG_END_STREAM if last else 0, stream.id, bytes(body[:size])))
            body = body[size:]
            self._send_window -= size
            stream._send_window -= size
        else:
            self._blocked.pop(stream.id, None)
        stream._body = body

    def _send_blocked(self) -> None:
        for stream in list(self._blocked.values()):
            if self._send_window <= 0:
                return
            self._send_body(stream)

    def _end(self, stream: Stream, status: GrpcStatus, *, reset: bool = True) -> None:
        """End ``stream`` with ``status``. If the peer ended it while our request was still being sent, tell
        it to stop expecting the rest (``reset``)."""
        stream.ended = True
        stream.status = status
        self._streams.pop(stream.id, None)
        if self._blocked.pop(stream.id, None) is not None and reset and status.code != CANCELLED:
            self._out.append(f.rst_stream_frame(stream.id, f.CANCEL))

    def _fail_all(self, status: GrpcStatus) -> list[Stream]:
        failed = list(self._streams.values())
        for stream in failed:
            self._end(stream, status, reset=False)
        return failed
