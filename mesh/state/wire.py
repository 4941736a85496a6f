"""Wire format of the replicated state: delta broadcasts, push-pull states and Yrs state vectors (pure).

```
delta  (gossip, <= max_delta_bytes):  version:u8  DELTA:u8  Delta       (proto/mesh_state.proto)
state  (push-pull):                   version:u8  STATE:u8  PeerState
```

A delta is one writer's Yrs transaction update: ``client`` wrote clocks ``[start, end)`` (``start == end``:
deletions only). A state section is the document either in full (``full``, ``base`` empty) or as the
diff against ``base``, a state vector every live peer is known to have reached. ``sv`` is the sender's
state vector (peers learn from it what the sender has). The two header bytes stay hand-written (read
before anything is parsed); the bodies are protobuf (generated into :mod:`mesh.wire_pb`). Kinds and field
numbers are append-only. Decoders require every field, bound a state's documents before parsing
(:func:`mesh.pbscan.check_fields`), and raise :class:`StateDecodeError` and nothing else on bad input.

State vectors use Yrs' own v1 encoding: varuint count, then (client, clock) varuint pairs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Final, TypeVar

# protobuf ships no type stubs: values read from parsed messages are typed by mesh_state_pb2.pyi.
from google.protobuf.message import DecodeError as ProtobufDecodeError  # type: ignore[import-untyped]
from google.protobuf.message import Message as ProtobufMessage

from mesh.errors import DecodeError
from mesh.limits import MAX_USER_STATE_BYTES
from mesh.pbscan import check_fields
from mesh.state.config import STATE_WIRE_VERSION
from mesh.wire_pb import mesh_state_pb2 as pb

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


def encode_delta(delta: Delta) -> bytes:
    """Raises ValueError for an integer out of its field's range (our own values never are)."""
    body = pb.Delta(
        doc=delta.doc,
        gen_number=delta.gen.number,
        gen_node=delta.gen.node,
        client=delta.client,
        start=delta.start,
        end=delta.end,
        update=delta.update,
    )
    encoded: bytes = body.SerializeToString()
    return bytes((STATE_WIRE_VERSION, StateKind.DELTA)) + encoded


def encode_state(state: PeerState) -> bytes:
    """Raises ValueError for an integer out of its field's range (our own values never are)."""
    body = pb.PeerState(
        node=state.node,
        docs=[
            pb.DocState(
                doc=d.doc,
                gen=pb.Generation(number=d.gen.number, node=d.gen.node, wall_ms=d.gen.wall_ms),
                full=d.full,
                sv=d.sv,
                base=d.base,
                update=d.update,
            )
            for d in state.docs
        ],
    )
    encoded: bytes = body.SerializeToString()
    return bytes((STATE_WIRE_VERSION, StateKind.STATE)) + encoded


# -- decoding --

_M = TypeVar("_M", bound=ProtobufMessage)

#: What a push-pull state may hold, checked before it is parsed (field numbers of PeerState); its size is
#: already bounded by the mesh (MAX_USER_STATE_BYTES).
_PEER_STATE_BOUNDS: Final = {2: (MAX_STATE_DOCS, MAX_USER_STATE_BYTES)}


def _parse(cls: type[_M], data: bytes, fields: tuple[str, ...]) -> _M:
    msg: _M = cls()
    try:
        msg.ParseFromString(data)
    except ProtobufDecodeError as exc:
        raise StateDecodeError(f"malformed {cls.__name__}: {exc}") from exc
    _require(msg, fields)
    return msg


def _require(msg: ProtobufMessage, fields: tuple[str, ...]) -> None:
    for name in fields:
        if not msg.HasField(name):
            raise StateDecodeError(f"{type(msg).__name__} without {name}")


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
    m = _parse(pb.Delta, data[2:], ("doc", "gen_number", "gen_node", "client", "start", "end", "update"))
    if m.end < m.start:
        raise StateDecodeError("delta clock range ends before it starts")
    if not m.update:
        raise StateDecodeError("empty delta")
    return Delta(m.doc, Generation(m.gen_number, m.gen_node), m.client, m.start, m.end, m.update)


def decode_state(data: bytes) -> PeerState:
    """Raises StateDecodeError."""
    if decode_kind(data) != StateKind.STATE:
        raise StateDecodeError("not a state")
    body = data[2:]
    try:
        check_fields(body, _PEER_STATE_BOUNDS, "state")
    except DecodeError as exc:
        raise StateDecodeError(str(exc)) from exc
    m = _parse(pb.PeerState, body, ("node",))
    docs = []
    for d in m.docs:
        _require(d, ("doc", "gen", "full", "sv", "base", "update"))
        _require(d.gen, ("number", "node", "wall_ms"))
        docs.append(
            DocState(d.doc, Generation(d.gen.number, d.gen.node, d.gen.wall_ms), d.full, d.sv, d.base, d.update)
        )
    return PeerState(m.node, tuple(docs))


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
