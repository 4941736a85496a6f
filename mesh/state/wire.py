"""Wire format of the replicated state: delta broadcasts, push-pull states and Yrs state vectors (pure).

Integers big-endian unless noted; ``str8`` = u8 length + UTF-8; ``bytes32`` = u32 length + bytes.

```
delta  (gossip, <= max_delta_bytes):  version:u8  DELTA:u8  doc:str8  gen:u32  gen_node:str8
                                      client:u64  start:u32  end:u32  update:rest
state  (push-pull):                   version:u8  STATE:u8  node:str8  count:u16
                                      (doc:str8 gen:u32 gen_node:str8 gen_wall_ms:u64 full:u8
                                       sv:bytes32 base:bytes32 update:bytes32) * count
```

A delta is one writer's Yrs transaction update: ``client`` wrote clocks ``[start, end)`` (``start == end``:
deletions only). A state section is the document either in full (``full = 1``, ``base`` empty) or as the
diff against ``base``, a state vector every live peer is known to have reached. ``sv`` is the sender's
state vector (peers learn from it what the sender has). Kinds are append-only. Decoders raise
:class:`StateDecodeError` and nothing else on bad input.

State vectors use Yrs' own v1 encoding: varuint count, then (client, clock) varuint pairs.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Final

from mesh.errors import DecodeError
from mesh.state.config import STATE_WIRE_VERSION

#: Most (client, clock) pairs accepted in one state vector: live writers plus the residue of restarted
#: ones between compactions; far above any real document.
MAX_SV_CLIENTS: Final = 65_536

#: Most document sections in one push-pull state (tables x shards + registries).
MAX_STATE_DOCS: Final = 4096

_MAX_U32: Final = 0xFFFF_FFFF
_MAX_U64: Final = 0xFFFF_FFFF_FFFF_FFFF


class StateDecodeError(DecodeError):
    """A state message is malformed, truncated, or of an unknown version or kind."""


class StateKind(IntEnum):
    """Message kinds after the version byte: append-only, never renumbered."""

    DELTA = 1
    STATE = 2


@dataclass(frozen=True, slots=True, order=True)
class Generation:
    """A document's compaction epoch. Ordered by (number, node): the highest generation wins everywhere,
    and two nodes compacting at once tie-break on their names. ``wall_ms`` is when it was made."""

    number: int
    node: str
    wall_ms: int = field(default=0, compare=False)


ZERO_GENERATION: Final = Generation(0, "")


@dataclass(frozen=True, slots=True)
class Delta:
    doc: str
    gen: Generation
    client: int
    start: int
    end: int
    update: bytes


@dataclass(frozen=True, slots=True)
class DocState:
    doc: str
    gen: Generation
    full: bool
    sv: bytes
    base: bytes
    update: bytes


@dataclass(frozen=True, slots=True)
class PeerState:
    node: str
    docs: tuple[DocState, ...]


# -- encoding --


def _str8(out: bytearray, value: str) -> None:
    raw = value.encode()
    if len(raw) > 255:
        raise ValueError(f"string of {len(raw)} bytes exceeds 255: {value[:40]!r}")
    out.append(len(raw))
    out += raw


def _bytes32(out: bytearray, value: bytes) -> None:
    out += struct.pack(">I", len(value))
    out += value


def encode_delta(delta: Delta) -> bytes:
    out = bytearray((STATE_WIRE_VERSION, StateKind.DELTA))
    _str8(out, delta.doc)
    out += struct.pack(">I", delta.gen.number)
    _str8(out, delta.gen.node)
    out += struct.pack(">QII", delta.client, delta.start, delta.end)
    out += delta.update
    return bytes(out)


def encode_state(state: PeerState) -> bytes:
    out = bytearray((STATE_WIRE_VERSION, StateKind.STATE))
    _str8(out, state.node)
    out += struct.pack(">H", len(state.docs))
    for doc in state.docs:
        _str8(out, doc.doc)
        out += struct.pack(">I", doc.gen.number)
        _str8(out, doc.gen.node)
        out += struct.pack(">QB", doc.gen.wall_ms, 1 if doc.full else 0)
        _bytes32(out, doc.sv)
        _bytes32(out, doc.base)
        _bytes32(out, doc.update)
    return bytes(out)


# -- decoding --


class _Reader:
    __slots__ = ("_data", "_pos")

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0

    def take(self, n: int) -> bytes:
        end = self._pos + n
        if end > len(self._data):
            raise StateDecodeError("truncated state message")
        chunk = self._data[self._pos : end]
        self._pos = end
        return chunk

    def unpack(self, fmt: str) -> tuple[int, ...]:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))

    def str8(self) -> str:
        (n,) = self.unpack(">B")
        try:
            return self.take(n).decode()
        except UnicodeDecodeError as exc:
            raise StateDecodeError("invalid UTF-8 in a name") from exc

    def bytes32(self) -> bytes:
        (n,) = self.unpack(">I")
        return self.take(n)

    def rest(self) -> bytes:
        chunk = self._data[self._pos :]
        self._pos = len(self._data)
        return chunk


def decode_kind(data: bytes) -> StateKind:
    """The kind of a state message. Raises StateDecodeError for an unknown version or kind."""
    if len(data) < 2:
        raise StateDecodeError("state message shorter than its header")
    if data[0] != STATE_WIRE_VERSION:
        raise StateDecodeError(f"unknown state wire version {data[0]}")
    try:
        return StateKind(data[1])
    except ValueError as exc:
        raise StateDecodeError(f"unknown state message kind {data[1]}") from exc


def decode_delta(data: bytes) -> Delta:
    """Raises StateDecodeError."""
    if decode_kind(data) != StateKind.DELTA:
        raise StateDecodeError("not a delta")
    r = _Reader(data)
    r.take(2)
    doc = r.str8()
    (number,) = r.unpack(">I")
    node = r.str8()
    client, start, end = r.unpack(">QII")
    if end < start:
        raise StateDecodeError("delta clock range ends before it starts")
    update = r.rest()
    if not update:
        raise StateDecodeError("empty delta")
    return Delta(doc, Generation(number, node), client, start, end, update)


def decode_state(data: bytes) -> PeerState:
    """Raises StateDecodeError."""
    if decode_kind(data) != StateKind.STATE:
        raise StateDecodeError("not a state")
    r = _Reader(data)
    r.take(2)
    node = r.str8()
    (count,) = r.unpack(">H")
    if count > MAX_STATE_DOCS:
        raise StateDecodeError(f"{count} documents in a state exceeds {MAX_STATE_DOCS}")
    docs = []
    for _ in range(count):
        doc = r.str8()
        (number,) = r.unpack(">I")
        gen_node = r.str8()
        wall_ms, full = r.unpack(">QB")
        sv, base, update = r.bytes32(), r.bytes32(), r.bytes32()
        docs.append(DocState(doc, Generation(number, gen_node, wall_ms), full == 1, sv, base, update))
    return PeerState(node, tuple(docs))


# -- Yrs state vectors --


def _varuint(out: bytearray, n: int) -> None:
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def encode_sv(sv: Mapping[int, int]) -> bytes:
    """A state vector in Yrs' v1 encoding (what ``Doc.get_update(state)`` takes)."""
    out = bytearray()
    _varuint(out, len(sv))
    for client, clock in sorted(sv.items()):
        _varuint(out, client)
        _varuint(out, clock)
    return bytes(out)


def decode_sv(data: bytes) -> dict[int, int]:
    """Raises StateDecodeError for a malformed or oversized state vector. Empty bytes: the empty vector."""
    values: list[int] = []
    n = shift = 0
    for byte in data:
        n |= (byte & 0x7F) << shift
        if byte & 0x80:
            shift += 7
            if shift > 63:
                raise StateDecodeError("malformed state vector")
            continue
        values.append(n)
        n = shift = 0
    if shift or not values:
        if not data:
            return {}
        raise StateDecodeError("malformed state vector")
    count = values[0]
    if count > MAX_SV_CLIENTS or len(values) != 1 + 2 * count:
        raise StateDecodeError("malformed or oversized state vector")
    sv = dict(zip(values[1::2], values[2::2], strict=True))
    if len(sv) != count or any(client > _MAX_U64 or clock > _MAX_U32 for client, clock in sv.items()):
        raise StateDecodeError("state vector entry out of range")
    return sv


def sv_covers(have: Mapping[int, int], need: Mapping[int, int]) -> bool:
    """Whether state vector ``have`` has reached ``need`` for every client."""
    return all(have.get(client, 0) >= clock for client, clock in need.items())


def sv_min(svs: list[Mapping[int, int]]) -> dict[int, int]:
    """Pointwise minimum: what every one of ``svs`` has reached (a missing client counts as 0)."""
    if not svs:
        return {}
    out = dict(svs[0])
    for sv in svs[1:]:
        for client in list(out):
            clock = min(out[client], sv.get(client, 0))
            if clock:
                out[client] = clock
            else:
                del out[client]
    return out
