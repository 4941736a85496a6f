"""Bound a protobuf message's top-level fields before protobuf parses it (pure, no protobuf import).

Protobuf allocates one object per element of a repeated message field, and an element can be two bytes:
a 16 MiB frame of empty push-pull members would be millions of objects before any of our bounds could
count them. :func:`check_fields` walks the top-level tags and lengths (skipping every value) and refuses a
message whose bounded fields occur too often or are too large, so the parse that follows is bounded by the
same constants the hand-written decoders enforced as they read.
"""

from __future__ import annotations

from collections.abc import Mapping

from mesh.errors import DecodeError

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
#: A varint is at most 10 bytes (64 bits, 7 per byte).
_MAX_VARINT_SHIFT = 63


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > _MAX_VARINT_SHIFT:
            raise DecodeError("malformed varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def check_fields(buf: bytes, bounds: Mapping[int, tuple[int, int]], what: str) -> None:
    """Refuse ``buf`` if a field number in ``bounds`` occurs more than its ``(max_count, max_bytes)`` allow
    or one occurrence is longer than ``max_bytes``; also if it is not a sequence of well-formed top-level
    fields (groups, long since deprecated, are refused). Raises DecodeError."""
    pos = 0
    counts = dict.fromkeys(bounds, 0)
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        field, wire_type = key >> 3, key & 7
        if wire_type == _VARINT:
            _, pos = _varint(buf, pos)
            size = 0
        elif wire_type == _LEN:
            size, pos = _varint(buf, pos)
        elif wire_type == _I64:
            size = 8
        elif wire_type == _I32:
            size = 4
        else:
            raise DecodeError(f"{what}: wire type {wire_type}")
        bound = bounds.get(field)
        if bound is not None:
            max_count, max_bytes = bound
            counts[field] += 1
            if counts[field] > max_count:
                raise DecodeError(f"{what}: field {field} more than {max_count} times")
            if size > max_bytes:
                raise DecodeError(f"{what}: field {field} of {size} bytes exceeds {max_bytes}")
        pos += size
    if pos != len(buf):
        raise DecodeError(f"truncated {what}")
