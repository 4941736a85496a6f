"""The SWIM messages as frozen values, and their append-only type numbers.

A packet (UDP) carries one message or a COMPOUND of several; a stream (TCP) frame carries one message.
Bodies are protobuf (proto/mesh.proto, :mod:`mesh.bodies`), framing is :mod:`mesh.codec`; these classes know
nothing of bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from mesh.member import MemberState, NodeMeta


class MessageType(IntEnum):
    """On the wire after the version byte. Append only: never renumber, never reuse a retired value."""

    PING = 1
    INDIRECT_PING = 2
    ACK = 3
    NACK = 4
    SUSPECT = 5
    ALIVE = 6
    DEAD = 7
    PUSH_PULL = 8
    COMPOUND = 9
    USER = 10
    ENCRYPTED = 11
    #: A stream frame sealed in chunks, each authenticated on its own (large frames under a keyring).
    ENCRYPTED_CHUNKS = 12


@dataclass(frozen=True, slots=True)
class Ping:
    """Direct probe. ``target`` names the member the sender means, so a ping that reaches a different
    process at a reused address is ignored instead of acked."""

    seq: int
    target: str
    source_name: str
    source_addr: str


@dataclass(frozen=True, slots=True)
class IndirectPing:
    """Ask the receiver to ping ``target`` for us and relay the ack (SWIM's ping-req).

    With ``nack`` set the relay answers NACK if the target stays silent for a probe timeout, which tells
    the requester that the relay itself is reachable (Lifeguard's local health signal)."""

    seq: int
    target: str
    target_addr: str
    nack: bool
    source_name: str
    source_addr: str


@dataclass(frozen=True, slots=True)
class Ack:
    seq: int


@dataclass(frozen=True, slots=True)
class Nack:
    seq: int


@dataclass(frozen=True, slots=True)
class Alive:
    incarnation: int
    node: str
    addr: str
    meta: NodeMeta


@dataclass(frozen=True, slots=True)
class Suspect:
    """``sender`` is the accuser; distinct accusers are Lifeguard's independent confirmations."""

    incarnation: int
    node: str
    sender: str


@dataclass(frozen=True, slots=True)
class Dead:
    """A death certificate. When ``sender == node`` the member left gracefully."""

    incarnation: int
    node: str
    sender: str


@dataclass(frozen=True, slots=True)
class User:
    """An opaque application broadcast (the delegate's), delivered to the receiver's ``notify_msg``."""

    payload: bytes


@dataclass(frozen=True, slots=True)
class PushPullMember:
    name: str
    addr: str
    meta: NodeMeta
    incarnation: int
    state: MemberState


@dataclass(frozen=True, slots=True)
class PushPull:
    """Full state exchange over a stream: every member we know plus the delegate's opaque state."""

    join: bool
    members: tuple[PushPullMember, ...]
    user_state: bytes


Message = Ping | IndirectPing | Ack | Nack | Alive | Suspect | Dead | User | PushPull

#: Messages whose meaning is "an update about a member", queued by member name in the broadcast queue.
MembershipUpdate = Alive | Suspect | Dead
