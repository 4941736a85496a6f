"""A prompt's token ids as a protobuf packed ``repeated uint32`` field, written from an array of 32-bit ids
without a Python int per id.

protobuf's own ``extend`` converts each id from a Python int and serializes it (~2.5 M instructions per 7,800
ids, a tenth of such a request), and needs the ids as a list first. The C extension `_packed` writes each id's
shortest varint straight from the array, as protobuf would (tens of thousands of instructions per 7,800 ids).

Where it was not built (no C compiler at install), every id is written as a 4-byte varint: its four 7-bit
groups, each byte but the last with the continuation bit set. That is longer than the shortest form (4 bytes
per id instead of 2-3) but valid: every protobuf parser reads a varint up to its last byte, whatever its
length. All ids are spread at once with Python's big-int arithmetic (~1.7 M instructions per 7,800 ids), each
32-bit lane of the array one varint: the shifts and masks never carry a bit across lanes because every id is
below 2**28.
"""

from __future__ import annotations

import sys
from array import array
from typing import Final

try:
    from node.workers import _packed

    _NATIVE = True
except ImportError:  # installed without a C compiler
    _NATIVE = False

# Per 32-bit lane: each 7-bit group in its byte; any bit an id of 2**28 or more would set.
_GROUPS: Final = (b"\x7f\x00\x00\x00", b"\x00\x7f\x00\x00", b"\x00\x00\x7f\x00", b"\x00\x00\x00\x7f")
_TOO_BIG: Final = b"\x00\x00\x00\xf0"
_CONTINUED: Final = b"\x80\x80\x80\x00"  # the continuation bits of the first three bytes
_WIRE_LENGTH_DELIMITED: Final = 2


class _Masks:
    """The lane masks for at least ``lanes`` lanes, grown by doubling; longer masks serve shorter arrays
    (an AND is as long as its shorter operand)."""

    __slots__ = ("groups", "lanes", "too_big")

    def __init__(self, lanes: int) -> None:
        self.lanes = lanes
        self.groups = tuple(int.from_bytes(g * lanes, "little") for g in _GROUPS)
        self.too_big = int.from_bytes(_TOO_BIG * lanes, "little")


class _MaskCache:
    """The masks for the longest prompt so far (one object swapped whole: safe from any thread)."""

    __slots__ = ("_masks",)

    def __init__(self) -> None:
        self._masks = _Masks(1024)

    def at_least(self, lanes: int) -> _Masks:
        masks = self._masks
        if masks.lanes < lanes:
            masks = self._masks = _Masks(max(lanes, 2 * masks.lanes))
        return masks


_mask_cache = _MaskCache()


def varint(value: int) -> bytes:
    """The shortest varint of a non-negative ``value``."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def field_tag(number: int) -> bytes:
    """The key of a length-delimited field (a message, bytes, or a packed repeated scalar)."""
    return varint(number << 3 | _WIRE_LENGTH_DELIMITED)


def packed_uint32(ids: array[int]) -> bytes | None:
    """The payload of a packed ``repeated uint32`` holding ``ids`` (4-byte items), or None when an id is
    negative (or, without the extension, 2**28 or more, or the machine is big-endian): the caller then lets
    protobuf write it."""
    if ids.itemsize != 4:
        return None
    if _NATIVE:
        return _packed.packed_uint32(ids)
    return _spread(ids)


def _spread(ids: array[int]) -> bytes | None:
    """`packed_uint32` without the extension: 4-byte varints (module docstring)."""
    if sys.byteorder != "little":
        return None
    lanes = len(ids)
    if lanes == 0:
        return b""
    masks = _mask_cache.at_least(lanes)
    x = int.from_bytes(ids.tobytes(), "little")
    if x & masks.too_big:
        return None
    g0, g1, g2, g3 = masks.groups
    spread = (x & g0) | ((x << 1) & g1) | ((x << 2) & g2) | ((x << 3) & g3)
    spread |= int.from_bytes(_CONTINUED * lanes, "little")
    return spread.to_bytes(4 * lanes, "little")
