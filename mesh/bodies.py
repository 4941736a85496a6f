"""Message bodies: the frozen values of :mod:`mesh.messages` to and from protobuf (proto/mesh.proto).

An encoded message is its type byte (:class:`MessageType`) followed by the protobuf serialization of its
body; packet and frame framing around it is :mod:`mesh.codec`'s. Decoding is the edge where attacker bytes
become values, so it is bounded before and validated after protobuf parses:

* before: a body is at most a packet (MAX_PACKET_BYTES) or a stream frame (MAX_STREAM_FRAME_BYTES), and a
  push-pull's top-level fields are walked first (:func:`mesh.pbscan.check_fields`) so that neither its member count
  (MAX_MEMBERS), any one member (MAX_PUSH_PULL_MEMBER_BYTES) nor its state (MAX_USER_STATE_BYTES) can make
  protobuf allocate past the bounds the hand-written decoder enforced;
* after: every field must be present (all are ``optional``, so a body cut at a field boundary is refused,
  not read as zero), names and strings within their byte bounds and printable, names non-empty, member
  addresses literal ip:port (:func:`mesh.member.check_member_addr`), metadata within NodeMeta's bounds,
  member states known. Protobuf itself refuses truncated fields and strings that are not UTF-8.

Anything else raises :class:`DecodeError`; the protobuf classes never leave this module.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Final, TypeVar, cast

# protobuf ships no type stubs (types-protobuf is not a dependency): its base class is Any, so every value
# read from a parsed message is annotated here, through the field types of the generated mesh_pb2.pyi.
from google.protobuf.message import DecodeError as ProtobufDecodeError  # type: ignore[import-untyped]
from google.protobuf.message import Message as ProtobufMessage

from mesh.errors import DecodeError
from mesh.limits import (
    MAX_ADDR_BYTES,
    MAX_MEMBERS,
    MAX_META_STRING_BYTES,
    MAX_NAME_BYTES,
    MAX_PUSH_PULL_MEMBER_BYTES,
    MAX_ROLES,
    MAX_USER_MSG_BYTES,
    MAX_USER_STATE_BYTES,
)
from mesh.member import MemberState, NodeMeta, check_member_addr
from mesh.messages import (
    Ack,
    Alive,
    Dead,
    IndirectPing,
    Message,
    MessageType,
    Nack,
    Ping,
    PushPull,
    PushPullMember,
    Suspect,
    User,
)
from mesh.pbscan import check_fields
from mesh.wire_pb import mesh_pb2 as pb

_M = TypeVar("_M", bound=ProtobufMessage)
_MEMBER_STATES = frozenset(int(s) for s in MemberState)

# -- encoding ---------------------------------------------------------------------------------------------


# Building the metadata message is most of an alive's or push-pull member's encoding, and members' metadata
# repeats in every one: built once per distinct value (halves an alive's encoding time). Never mutated:
# protobuf copies a submessage passed to a constructor.
@functools.lru_cache(maxsize=4096)
def _pb_meta(meta: NodeMeta) -> pb.NodeMeta:
    return pb.NodeMeta(
        http_addr=meta.http_addr,
        version=meta.version,
        roles=[pb.Role(key=key, value=value) for key, value in meta.roles],
    )


def encode_message(msg: Message) -> bytes:
    """type:u8 + protobuf body. Raises ValueError only for values our own constructors should have rejected
    (an integer that is not a u32, an oversized user message or push-pull)."""
    body: ProtobufMessage
    match msg:
        case Ping(seq, target, source_name, source_addr):
            kind = MessageType.PING
            body = pb.Ping(seq=seq, target=target, source_name=source_name, source_addr=source_addr)
        case IndirectPing(seq, target, target_addr, nack, source_name, source_addr):
            kind = MessageType.INDIRECT_PING
            body = pb.IndirectPing(
                seq=seq,
                target=target,
                target_addr=target_addr,
                nack=nack,
                source_name=source_name,
                source_addr=source_addr,
            )
        case Ack(seq):
            kind, body = MessageType.ACK, pb.Ack(seq=seq)
        case Nack(seq):
            kind, body = MessageType.NACK, pb.Nack(seq=seq)
        case Alive(inc, node, addr, meta):
            kind, body = MessageType.ALIVE, pb.Alive(incarnation=inc, node=node, addr=addr, meta=_pb_meta(meta))
        case Suspect(inc, node, sender):
            kind, body = MessageType.SUSPECT, pb.Suspect(incarnation=inc, node=node, sender=sender)
        case Dead(inc, node, sender):
            kind, body = MessageType.DEAD, pb.Dead(incarnation=inc, node=node, sender=sender)
        case User(payload):
            if len(payload) > MAX_USER_MSG_BYTES:
                raise ValueError(f"user message of {len(payload)} bytes exceeds {MAX_USER_MSG_BYTES}")
            kind, body = MessageType.USER, pb.User(payload=payload)
        case PushPull(join, members, user_state):
            if len(members) > MAX_MEMBERS or len(user_state) > MAX_USER_STATE_BYTES:
                raise ValueError("push-pull exceeds MAX_MEMBERS or MAX_USER_STATE_BYTES")
            kind = MessageType.PUSH_PULL
            body = pb.PushPull(
                join=join,
                members=[
                    pb.PushPullMember(
                        name=m.name,
                        addr=m.addr,
                        meta=_pb_meta(m.meta),
                        incarnation=m.incarnation,
                        state=cast(pb.MemberState, int(m.state)),
                    )
                    for m in members
                ],
                user_state=user_state,
            )
    encoded: bytes = body.SerializeToString()
    return bytes((kind,)) + encoded


# -- decoding ---------------------------------------------------------------------------------------------


def _parse(cls: type[_M], buf: bytes, fields: tuple[str, ...]) -> _M:
    """Parse ``buf`` (the body after the type byte) and require every field in ``fields``."""
    msg: _M = cls()
    try:
        msg.ParseFromString(buf)
    except ProtobufDecodeError as exc:
        raise DecodeError(f"malformed {cls.__name__}: {exc}") from exc
    _require(msg, fields)
    return msg


def _require(msg: ProtobufMessage, fields: tuple[str, ...]) -> None:
    for field in fields:
        if not msg.HasField(field):
            raise DecodeError(f"{type(msg).__name__} without {field}")


def _text(value: str, limit: int) -> str:
    # len(value) counts characters, never more than its UTF-8 bytes: encode only when it could be over.
    if len(value) * 4 > limit and len(value.encode("utf-8")) > limit:
        raise DecodeError(f"string of {len(value.encode('utf-8'))} bytes exceeds {limit}")
    if not value.isprintable():
        raise DecodeError(f"unprintable character in {value!r}")
    return value


def _name(value: str) -> str:
    if not value:
        raise DecodeError("empty member name")
    return _text(value, MAX_NAME_BYTES)


def _addr(value: str) -> str:
    if len(value) > MAX_ADDR_BYTES or not _valid_addr(value):
        raise DecodeError(f"member address: expected ip:port, got {value[:MAX_ADDR_BYTES]!r}")
    return value


# Members' addresses and metadata repeat in every push-pull and alive message: validate each once.
@functools.lru_cache(maxsize=4096)
def _valid_addr(value: str) -> bool:
    try:
        check_member_addr(value)
    except ValueError:
        return False
    return True


@functools.lru_cache(maxsize=4096)
def _make_meta(http_addr: str, version: str, roles: tuple[tuple[str, str], ...]) -> NodeMeta | None:
    try:
        return NodeMeta(http_addr, version, roles)
    except ValueError:
        return None


def _meta(msg: pb.NodeMeta) -> NodeMeta:
    _require(msg, ("http_addr", "version"))
    if len(msg.roles) > MAX_ROLES:
        raise DecodeError(f"{len(msg.roles)} roles exceeds {MAX_ROLES}")
    roles = []
    for role in msg.roles:
        _require(role, ("key", "value"))
        roles.append((_text(role.key, MAX_META_STRING_BYTES), _text(role.value, MAX_META_STRING_BYTES)))
    meta = _make_meta(
        _text(msg.http_addr, MAX_META_STRING_BYTES), _text(msg.version, MAX_META_STRING_BYTES), tuple(roles)
    )
    if meta is None:
        raise DecodeError("metadata exceeds its bounds")
    return meta


def _ping(buf: bytes) -> Ping:
    m = _parse(pb.Ping, buf, ("seq", "target", "source_name", "source_addr"))
    # An empty target is a ping to whoever listens (the join and TCP fallback paths).
    return Ping(m.seq, _text(m.target, MAX_NAME_BYTES), _text(m.source_name, MAX_NAME_BYTES), _addr(m.source_addr))


def _indirect(buf: bytes) -> IndirectPing:
    m = _parse(pb.IndirectPing, buf, ("seq", "target", "target_addr", "nack", "source_name", "source_addr"))
    return IndirectPing(
        m.seq, _name(m.target), _addr(m.target_addr), m.nack, _text(m.source_name, MAX_NAME_BYTES), _addr(m.source_addr)
    )


def _ack(buf: bytes) -> Ack:
    return Ack(_parse(pb.Ack, buf, ("seq",)).seq)


def _nack(buf: bytes) -> Nack:
    return Nack(_parse(pb.Nack, buf, ("seq",)).seq)


def _alive(buf: bytes) -> Alive:
    m = _parse(pb.Alive, buf, ("incarnation", "node", "addr", "meta"))
    return Alive(m.incarnation, _name(m.node), _addr(m.addr), _meta(m.meta))


def _suspect(buf: bytes) -> Suspect:
    m = _parse(pb.Suspect, buf, ("incarnation", "node", "sender"))
    return Suspect(m.incarnation, _name(m.node), _name(m.sender))


def _dead(buf: bytes) -> Dead:
    m = _parse(pb.Dead, buf, ("incarnation", "node", "sender"))
    return Dead(m.incarnation, _name(m.node), _name(m.sender))


def _user(buf: bytes) -> User:
    # A packet bounds the parse; the payload bound is the sender's promise to the delegate.
    m = _parse(pb.User, buf, ("payload",))
    if len(m.payload) > MAX_USER_MSG_BYTES:
        raise DecodeError(f"user message of {len(m.payload)} bytes exceeds {MAX_USER_MSG_BYTES}")
    return User(m.payload)


#: What a push-pull may hold, checked before it is parsed (field numbers of proto/mesh.proto's PushPull).
_PUSH_PULL_BOUNDS: Final = {
    2: (MAX_MEMBERS, MAX_PUSH_PULL_MEMBER_BYTES),  # members
    3: (1, MAX_USER_STATE_BYTES),  # user_state
}


def _push_pull(buf: bytes) -> PushPull:
    check_fields(buf, _PUSH_PULL_BOUNDS, "push-pull")
    m = _parse(pb.PushPull, buf, ("join", "user_state"))
    members = []
    for p in m.members:
        _require(p, ("name", "addr", "meta", "incarnation", "state"))
        if p.state not in _MEMBER_STATES:
            raise DecodeError(f"unknown member state {p.state}")
        members.append(PushPullMember(_name(p.name), _addr(p.addr), _meta(p.meta), p.incarnation, MemberState(p.state)))
    return PushPull(m.join, tuple(members), m.user_state)


DECODERS: dict[int, Callable[[bytes], Message]] = {
    MessageType.PING: _ping,
    MessageType.INDIRECT_PING: _indirect,
    MessageType.ACK: _ack,
    MessageType.NACK: _nack,
    MessageType.ALIVE: _alive,
    MessageType.SUSPECT: _suspect,
    MessageType.DEAD: _dead,
    MessageType.USER: _user,
    MessageType.PUSH_PULL: _push_pull,
}
