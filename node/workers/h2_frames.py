"""HTTP/2 frames (RFC 9113 §4, §6): the constants, building frames, and cutting a byte stream into frames.

Pure: no I/O. Only what a gRPC client needs; unknown frame types are returned as they are, and the caller
ignores them, as the RFC requires.
"""

from __future__ import annotations

import struct
from typing import NamedTuple, cast

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types (§6).
DATA = 0x0
HEADERS = 0x1
PRIORITY = 0x2
RST_STREAM = 0x3
SETTINGS = 0x4
PUSH_PROMISE = 0x5
PING = 0x6
GOAWAY = 0x7
WINDOW_UPDATE = 0x8
CONTINUATION = 0x9

# Flags.
FLAG_END_STREAM = 0x1
FLAG_ACK = 0x1
FLAG_END_HEADERS = 0x4
FLAG_PADDED = 0x8
FLAG_PRIORITY = 0x20

# SETTINGS parameters (§6.5.2).
SETTINGS_HEADER_TABLE_SIZE = 0x1
SETTINGS_ENABLE_PUSH = 0x2
SETTINGS_MAX_CONCURRENT_STREAMS = 0x3
SETTINGS_INITIAL_WINDOW_SIZE = 0x4
SETTINGS_MAX_FRAME_SIZE = 0x5
SETTINGS_MAX_HEADER_LIST_SIZE = 0x6

# Error codes (§7).
NO_ERROR = 0x0
PROTOCOL_ERROR = 0x1
INTERNAL_ERROR = 0x2
FLOW_CONTROL_ERROR = 0x3
STREAM_CLOSED = 0x5
FRAME_SIZE_ERROR = 0x6
REFUSED_STREAM = 0x7
CANCEL = 0x8
COMPRESSION_ERROR = 0x9
ENHANCE_YOUR_CALM = 0xB

#: The largest flow-control window (§6.9.1) and stream id (§5.1.1).
MAX_WINDOW = 2**31 - 1
MAX_STREAM_ID = 2**31 - 1
#: The protocol's defaults until the peer's SETTINGS say otherwise (§6.5.2).
DEFAULT_WINDOW = 65_535
DEFAULT_MAX_FRAME_SIZE = 16_384
#: The largest frame we accept: what we advertise as SETTINGS_MAX_FRAME_SIZE. Bigger frames mean fewer reads
#: for large responses; 1 MiB bounds what one frame can make us buffer.
LOCAL_MAX_FRAME_SIZE = 1 << 20
HEADER_SIZE = 9

_U32 = struct.Struct(">I")
_U16_U32 = struct.Struct(">HI")
_U32_U32 = struct.Struct(">II")
#: A gRPC message's prefix: the compressed flag and the length (grpc_wire.PREFIX_SIZE; framing knows no more
#: of gRPC than `feed_messages` needs, so the one number is repeated rather than imported).
GRPC_PREFIX_SIZE = 5

try:
    from node.workers._rx import frames as _c_frames
except ImportError:  # installed without a C compiler: the Python loop does it all
    _c_frames = None  # type: ignore[assignment]


class FrameError(Exception):
    """The peer broke HTTP/2 framing; the connection cannot continue. ``code`` is the GOAWAY error code."""

    def __init__(self, message: str, code: int = PROTOCOL_ERROR) -> None:
        super().__init__(message)
        self.code = code


class Frame(NamedTuple):
    """One received frame (a NamedTuple: immutable and cheap to build, one per frame)."""

    kind: int
    flags: int
    stream_id: int
    payload: bytes


# Frame(...) runs the NamedTuple's Python-level __new__; tuple.__new__ builds the same instance in C. One per
# received frame (one per token on a Generate stream).
_new_frame = tuple.__new__


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return (len(payload) << 8 | kind).to_bytes(4, "big") + bytes((flags,)) + _U32.pack(stream_id) + payload


def grpc_prefixed(message: bytes) -> bytes:
    """An uncompressed gRPC message with its prefix again: the DATA payload `feed_messages` took it from."""
    return b"\0" + _U32.pack(len(message)) + message


def settings_frame(settings: dict[int, int]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(_U16_U32.pack(k, v) for k, v in settings.items()))


def window_update_frame(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, _U32.pack(increment))


def rst_stream_frame(stream_id: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream_id, _U32.pack(code))


def goaway_frame(last_stream_id: int, code: int) -> bytes:
    return frame(GOAWAY, 0, 0, _U32_U32.pack(last_stream_id, code))


def parse_settings(payload: bytes) -> list[tuple[int, int]]:
    """Raises FrameError when the payload is not a whole number of 6-byte entries."""
    if len(payload) % 6:
        raise FrameError("SETTINGS payload is not a multiple of 6 bytes", FRAME_SIZE_ERROR)
    return [_U16_U32.unpack_from(payload, i) for i in range(0, len(payload), 6)]


def parse_u32(payload: bytes, what: str) -> int:
    """The 31-bit value of a 4-byte payload (WINDOW_UPDATE, RST_STREAM). Raises FrameError on another length."""
    if len(payload) != 4:
        raise FrameError(f"{what} payload is {len(payload)} bytes, not 4", FRAME_SIZE_ERROR)
    return int(_U32.unpack(payload)[0]) & 0x7FFFFFFF


def parse_goaway(payload: bytes) -> tuple[int, int, bytes]:
    """(last stream id, error code, debug data). Raises FrameError when shorter than 8 bytes."""
    if len(payload) < 8:
        raise FrameError("GOAWAY payload shorter than 8 bytes", FRAME_SIZE_ERROR)
    last, code = _U32_U32.unpack_from(payload)
    return last & 0x7FFFFFFF, code, payload[8:]


def strip_padding(flags: int, payload: bytes) -> bytes:
    """DATA/HEADERS payload without padding. Raises FrameError when the pad length exceeds the payload."""
    if not flags & FLAG_PADDED:
        return payload
    if not payload or payload[0] >= len(payload):
        raise FrameError("padding longer than the frame")
    return payload[1 : len(payload) - payload[0]]


class FrameReader:
    """Bytes in, whole frames out, across arbitrary chunk boundaries."""

    __slots__ = ("_buf", "_max_size")

    def __init__(self, max_frame_size: int = LOCAL_MAX_FRAME_SIZE) -> None:
        self._buf = bytearray()
        self._max_size = max_frame_size

    def feed(self, data: bytes) -> list[Frame]:
        """Every frame completed by ``data``, in order. Raises FrameError on a frame above the size limit."""
        # No message is at most -1 bytes long: every item is a Frame.
        return cast(list[Frame], self.feed_messages(data, -1))

    def feed_messages(self, data: bytes, max_message: int) -> list[Frame | tuple[int, bytes]]:
        """Like `feed`, but a DATA frame without flags whose payload is exactly one uncompressed gRPC message
        of at most ``max_message`` bytes (a streamed token's frame: the one hot kind) comes out as
        ``(stream_id, message)``, the message without its 5-byte prefix. Order is kept; a caller tells the two
        apart by ``isinstance(item, Frame)``. The C extension `_rx` does the run of whole frames; this loop does
        what it leaves (a frame above the size limit raises here), and all of it where the extension is absent."""
        buf = self._buf
        buf += data
        pos = 0
        items: list[Frame | tuple[int, bytes]] = []
        if _c_frames is not None:
            pos, items = _c_frames(buf, self._max_size, max_message, Frame)
        end = len(buf)
        while end - pos >= HEADER_SIZE:
            head = _U32_U32.unpack_from(buf, pos)
            length = head[0] >> 8
            if length > self._max_size:
                raise FrameError(f"frame of {length} bytes exceeds {self._max_size}", FRAME_SIZE_ERROR)
            start = pos + HEADER_SIZE
            if end - start < length:
                break
            kind = head[0] & 0xFF
            flags = head[1] >> 24
            stream_id = ((head[1] & 0xFFFFFF) << 8 | buf[pos + 8]) & 0x7FFFFFFF
            pos = start + length
            if (
                kind == DATA
                and not flags
                and length >= GRPC_PREFIX_SIZE
                and buf[start] == 0
                and _U32.unpack_from(buf, start + 1)[0] == length - GRPC_PREFIX_SIZE <= max_message
            ):
                items.append((stream_id, bytes(buf[start + GRPC_PREFIX_SIZE : pos])))
            else:
                items.append(_new_frame(Frame, (kind, flags, stream_id, bytes(buf[start:pos]))))
        del buf[:pos]
        return items
