"""gRPC over HTTP/2, the parts above the frames: length-prefixed messages, request headers, status.

Pure. What the gRPC protocol document ("PROTOCOL-HTTP2.md") specifies: each message is a 1-byte compressed
flag and a 4-byte big-endian length before the bytes; the status travels as ``grpc-status``/``grpc-message``
in the trailers (or in the only HEADERS of a trailers-only response); a response that is not HTTP 200 maps
to a status by its HTTP code.
"""

from __future__ import annotations

import struct
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass

PREFIX_SIZE = 5
_PREFIX = struct.Struct(">BI")

# Status codes (grpc/status.h); names as grpc.StatusCode spells them.
OK = 0
CANCELLED = 1
UNKNOWN = 2
DEADLINE_EXCEEDED = 4
UNIMPLEMENTED = 12
INTERNAL = 13
UNAVAILABLE = 14
STATUS_NAMES = (
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
)
# "HTTP to gRPC Status Code Mapping" (grpc/doc/http-grpc-status-mapping.md); any other code is UNKNOWN.
_HTTP_STATUS = {400: INTERNAL, 401: 16, 403: 7, 404: 12, 429: UNAVAILABLE, 502: UNAVAILABLE, 503: UNAVAILABLE, 504: 14}


class MessageError(Exception):
    """The peer sent a message this client cannot read (compressed, or above the size bound)."""


@dataclass(frozen=True, slots=True)
class GrpcStatus:
    code: int
    message: str = ""

    @property
    def name(self) -> str:
        return STATUS_NAMES[self.code] if 0 <= self.code < len(STATUS_NAMES) else f"CODE_{self.code}"


def encode_message(message: bytes) -> bytes:
    """One uncompressed length-prefixed message."""
    return _PREFIX.pack(0, len(message)) + message


def request_headers(authority: str, path: str) -> list[tuple[str, str]]:
    """The request headers of a unary-request call, in the order the protocol requires (pseudo-headers first)."""
    return [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        ("user-agent", "smg-node-h2"),
    ]


class MessageReader:
    """DATA payloads in, whole messages out, across any split of messages into frames."""

    __slots__ = ("_buf", "_max_bytes")

    def __init__(self, max_message_bytes: int) -> None:
        self._buf = bytearray()
        self._max_bytes = max_message_bytes

    @property
    def partial(self) -> bool:
        """Bytes of an incomplete message are held (a stream ending now was cut mid-message)."""
        return bool(self._buf)

    def feed(self, data: bytes, out: list[bytes]) -> None:
        """Append every message completed by ``data`` to ``out``. Raises MessageError (compressed, too big)."""
        buf = self._buf
        if not buf and len(data) >= PREFIX_SIZE:  # the common case: whole messages in one DATA frame
            flag, size = _PREFIX.unpack_from(data, 0)
            if not flag and size == len(data) - PREFIX_SIZE and size <= self._max_bytes:
                out.append(data[PREFIX_SIZE:])  # exactly one (a streamed token's message): no loop, no calls
                return
            pos, end = 0, len(data)
            while end - pos >= PREFIX_SIZE:
                flag, size = _PREFIX.unpack_from(data, pos)
                self._check(flag, size)
                stop = pos + PREFIX_SIZE + size
                if stop > end:
                    break
                out.append(data[pos + PREFIX_SIZE : stop])
                pos = stop
            if pos < end:
                buf += data[pos:]
            return
        buf += data
        pos, end = 0, len(buf)
        while end - pos >= PREFIX_SIZE:
            flag, size = _PREFIX.unpack_from(buf, pos)
            self._check(flag, size)
            stop = pos + PREFIX_SIZE + size
            if stop > end:
                break
            out.append(bytes(buf[pos + PREFIX_SIZE : stop]))
            pos = stop
        del buf[:pos]

    def _check(self, flag: int, size: int) -> None:
        if flag:
            raise MessageError("the worker sent a compressed message (this client asks for none)")
        if size > self._max_bytes:
            raise MessageError(f"the worker sent a {size}-byte message (the bound is {self._max_bytes})")


def status_of(headers: Iterable[tuple[str, str]], *, http_status: int | None) -> GrpcStatus | None:
    """The status carried by trailers (or a trailers-only response); None when they carry none.

    ``http_status`` is the response's :status when known: anything but 200 decides the status by itself.
    """
    fields = dict(headers)
    if http_status is None and ":status" in fields:
        http_status = _int(fields[":status"])
    if http_status is not None and http_status != 200:
        code = _HTTP_STATUS.get(http_status, UNKNOWN)
        return GrpcStatus(code, f"HTTP status {http_status}")
    raw = fields.get("grpc-status")
    if raw is None:
        return None
    value = _int(raw)
    if value is None:
        return GrpcStatus(UNKNOWN, f"unparsable grpc-status {raw!r}")
    return GrpcStatus(value, urllib.parse.unquote(fields.get("grpc-message", "")))


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None
