"""The wire format: round trips, bounds, and hostile bytes never escaping as anything but a drop."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mesh.codec import (
    compound,
    decode_messages,
    encode_message,
    frame_length,
    open_frame,
    open_packet,
    seal_frame,
    seal_packet,
)
from mesh.errors import DecodeError, DecryptError, RemoteProtocolError
from mesh.keyring import Keyring
from mesh.limits import (
    MAX_MEMBERS,
    MAX_META_BYTES,
    MAX_PACKET_BYTES,
    MAX_PUSH_PULL_MEMBER_BYTES,
    MAX_ROLES,
    MAX_STREAM_FRAME_BYTES,
    PROTOCOL_VERSION,
)
from mesh.member import MemberState, NodeMeta
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
from mesh.wire_pb import mesh_pb2 as pb

# Names and labels are printable text (mesh/member.py): the wire refuses control characters.
printable = st.characters(codec="utf-8").filter(str.isprintable)
names = st.text(printable, min_size=1, max_size=20)
addrs = st.builds(
    lambda a, b, port: f"10.{a}.{b}.1:{port}", st.integers(0, 255), st.integers(0, 255), st.integers(1, 65535)
)
u32 = st.integers(0, 2**32 - 1)
short = st.text(printable, max_size=30)
metas = st.builds(
    NodeMeta.create,
    short,
    short,
    st.dictionaries(st.text(printable, max_size=10), st.text(printable, max_size=10), max_size=4),
)
packet_messages: st.SearchStrategy[Message] = st.one_of(
    st.builds(Ping, u32, st.just("") | names, names, addrs),
    st.builds(IndirectPing, u32, names, addrs, st.booleans(), names, addrs),
    st.builds(Ack, u32),
    st.builds(Nack, u32),
    st.builds(Alive, u32, names, addrs, metas),
    st.builds(Suspect, u32, names, names),
    st.builds(Dead, u32, names, names),
    st.builds(User, st.binary(max_size=200)),
)
push_pulls = st.builds(
    PushPull,
    st.booleans(),
    st.lists(st.builds(PushPullMember, names, addrs, metas, u32, st.sampled_from(MemberState)), max_size=5).map(tuple),
    st.binary(max_size=300),
)
KEY = bytes(range(32))


@given(packet_messages)
def test_every_packet_message_round_trips(msg: Message) -> None:
    assert decode_messages(encode_message(msg)) == [msg]
    assert open_packet(seal_packet(encode_message(msg), None), None) == [msg]


@given(st.lists(packet_messages, min_size=2, max_size=10))
def test_compound_round_trips_in_order(msgs: list[Message]) -> None:
    packet = seal_packet(compound([encode_message(m) for m in msgs]), None)
    assert open_packet(packet, None) == msgs


@given(st.one_of(packet_messages, push_pulls))
def test_frames_round_trip_plain_and_encrypted(msg: Message) -> None:
    ring = Keyring([KEY])
    for keyring in (None, ring):
        frame = seal_frame(encode_message(msg), keyring)
        assert frame_length(frame[:6]) == len(frame) - 6
        assert open_frame(frame, keyring) == msg


@settings(max_examples=300)
@given(st.binary(max_size=MAX_PACKET_BYTES + 10))
def test_random_bytes_only_ever_raise_remote_protocol_errors(data: bytes) -> None:
    for keyring in (None, Keyring([KEY])):
        try:
            open_packet(data, keyring)
        except RemoteProtocolError:
            pass
        try:
            open_frame(data, keyring)
        except RemoteProtocolError:
            pass


@given(packet_messages, st.data())
def test_every_truncation_is_a_decode_error(msg: Message, data: st.DataObject) -> None:
    encoded = encode_message(msg)
    cut = data.draw(st.integers(0, len(encoded) - 1))
    with pytest.raises(DecodeError):
        decode_messages(encoded[:cut])


@given(st.lists(packet_messages, min_size=2, max_size=5), st.data())
def test_flipped_bytes_never_crash_the_decoder(msgs: list[Message], data: st.DataObject) -> None:
    packet = bytearray(seal_packet(compound([encode_message(m) for m in msgs]), None))
    index = data.draw(st.integers(0, len(packet) - 1))
    packet[index] ^= data.draw(st.integers(1, 255))
    try:
        open_packet(bytes(packet), None)
    except RemoteProtocolError:
        pass


def test_unknown_fields_are_skipped_so_fields_can_be_added() -> None:
    # A newer node's Ack with a field 9 (varint 5) and a field 10 (bytes): this version reads the Ack.
    encoded = encode_message(Ack(7)) + b"\x48\x05" + b"\x52\x03new"
    assert decode_messages(encoded) == [Ack(7)]
    # Bytes that are not protobuf fields are malformed, not ignored.
    with pytest.raises(DecodeError):
        decode_messages(encode_message(Ack(7)) + b"\xff")


def test_a_body_without_a_field_is_refused_not_read_as_zero() -> None:
    with pytest.raises(DecodeError, match="without seq"):
        decode_messages(bytes([MessageType.ACK]))
    with pytest.raises(DecodeError, match="without sender"):
        decode_messages(bytes([MessageType.DEAD]) + pb.Dead(incarnation=1, node="a").SerializeToString())


def test_wrong_version_and_oversized_packets_are_rejected() -> None:
    good = seal_packet(encode_message(Ack(1)), None)
    with pytest.raises(DecodeError, match="version"):
        open_packet(bytes([PROTOCOL_VERSION + 1]) + good[1:], None)
    with pytest.raises(DecodeError, match="exceeds"):
        open_packet(good + bytes(MAX_PACKET_BYTES), None)
    with pytest.raises(DecodeError, match="unexpected message type"):
        open_packet(bytes([PROTOCOL_VERSION, 200]), None)
    # Push-pull travels only over streams, never in a packet.
    pp = encode_message(PushPull(False, (), b""))
    with pytest.raises(DecodeError):
        open_packet(seal_packet(pp, None), None)


def test_frame_header_bounds() -> None:
    with pytest.raises(DecodeError, match="exceeds"):
        frame_length(struct.pack(">BBI", PROTOCOL_VERSION, MessageType.PUSH_PULL, MAX_STREAM_FRAME_BYTES + 1))
    with pytest.raises(DecodeError, match="version"):
        frame_length(struct.pack(">BBI", 9, MessageType.PING, 1))
    with pytest.raises(DecodeError, match="frame type"):
        frame_length(struct.pack(">BBI", PROTOCOL_VERSION, 250, 1))
    frame = seal_frame(encode_message(Ack(3)), None)
    with pytest.raises(DecodeError, match="length"):
        open_frame(frame + b"x", None)


def test_compound_part_count_is_bounded() -> None:
    body = bytes([MessageType.COMPOUND, 200]) + struct.pack(">H", 5) * 200
    with pytest.raises(DecodeError, match="compound"):
        decode_messages(body)
    with pytest.raises(DecodeError, match="compound"):
        decode_messages(bytes([MessageType.COMPOUND, 0]))


def test_nested_compound_is_rejected() -> None:
    inner = compound([encode_message(Ack(1)), encode_message(Ack(2))])
    outer = compound([inner, encode_message(Ack(3))])
    with pytest.raises(DecodeError):
        decode_messages(outer)


def test_member_fields_are_validated_on_decode() -> None:
    bad_addr = encode_message(Alive(1, "a", "10.0.0.1:7946", NodeMeta())).replace(b"10.0.0.1:7946", b"10.0.0.1:79x6")
    with pytest.raises(DecodeError, match="address"):
        decode_messages(bad_addr)
    empty_name = bytes([MessageType.SUSPECT]) + pb.Suspect(incarnation=1, node="", sender="x").SerializeToString()
    with pytest.raises(DecodeError, match="empty member name"):
        decode_messages(empty_name)
    # A Dead whose node (field 2) is the bytes ff fe: protobuf refuses a string that is not UTF-8.
    bad_utf8 = bytes([MessageType.DEAD]) + b"\x08\x01" + b"\x12\x02\xff\xfe" + b"\x1a\x01x"
    with pytest.raises(DecodeError, match="malformed"):
        decode_messages(bad_utf8)
    member = pb.PushPullMember(
        name="a", addr="10.0.0.1:1", meta=pb.NodeMeta(http_addr="", version=""), incarnation=1, state=9
    )
    bad_state = (
        bytes([MessageType.PUSH_PULL]) + pb.PushPull(join=False, members=[member], user_state=b"").SerializeToString()
    )
    with pytest.raises(DecodeError, match="state"):
        open_frame(seal_frame(bad_state, None), None)


def test_metadata_is_bounded_at_construction_and_on_the_wire() -> None:
    with pytest.raises(ValueError, match="metadata"):
        NodeMeta.create(roles={f"k{i}": "v" * 60 for i in range(9)})
    with pytest.raises(ValueError, match="roles"):
        NodeMeta.create(roles={str(i): "" for i in range(MAX_ROLES + 1)})
    fits = NodeMeta.create(http_addr="h" * 200, version="v" * 200, roles={"a": "b" * 100})
    assert len(encode_message(Alive(1, "n", "10.0.0.1:1", fits))) < MAX_META_BYTES + 150
    # A hand-built alive whose metadata exceeds MAX_META_BYTES is refused by the decoder.
    meta = pb.NodeMeta(http_addr="h" * 255, version="v" * 255, roles=[pb.Role(key="k", value="v" * 16)])
    big = (
        bytes([MessageType.ALIVE]) + pb.Alive(incarnation=1, node="n", addr="10.0.0.1:1", meta=meta).SerializeToString()
    )
    with pytest.raises(DecodeError, match="metadata"):
        decode_messages(big)
    over = pb.NodeMeta(http_addr="h" * 256, version="")
    long = (
        bytes([MessageType.ALIVE]) + pb.Alive(incarnation=1, node="n", addr="10.0.0.1:1", meta=over).SerializeToString()
    )
    with pytest.raises(DecodeError, match="exceeds 255"):
        decode_messages(long)


def test_encrypted_packets_authenticate_the_version_byte() -> None:
    ring = Keyring([KEY])
    packet = seal_packet(encode_message(Ack(5)), ring)
    assert open_packet(packet, ring) == [Ack(5)]
    tampered = bytearray(packet)
    tampered[-1] ^= 1
    with pytest.raises(DecryptError):
        open_packet(bytes(tampered), ring)
    # Moving the sealed body under another header (type byte) fails authentication too.
    frame = seal_frame(encode_message(Ack(5)), ring)
    with pytest.raises(DecryptError):
        open_frame(frame[:1] + bytes([MessageType.ENCRYPTED]) + frame[2:6] + frame[6:-1] + b"\x00", ring)


def test_plaintext_and_ciphertext_do_not_mix() -> None:
    ring = Keyring([KEY])
    with pytest.raises(DecryptError, match="unencrypted"):
        open_packet(seal_packet(encode_message(Ack(1)), None), ring)
    with pytest.raises(DecryptError, match="no keyring"):
        open_packet(seal_packet(encode_message(Ack(1)), ring), None)
    with pytest.raises(DecryptError, match="unencrypted"):
        open_frame(seal_frame(encode_message(Ack(1)), None), ring)
    with pytest.raises(DecryptError, match="no keyring"):
        open_frame(seal_frame(encode_message(Ack(1)), ring), None)


def test_message_types_are_append_only() -> None:
    # Values are on the wire: this table may only ever grow.
    assert {t.name: t.value for t in MessageType} == {
        "PING": 1,
        "INDIRECT_PING": 2,
        "ACK": 3,
        "NACK": 4,
        "SUSPECT": 5,
        "ALIVE": 6,
        "DEAD": 7,
        "PUSH_PULL": 8,
        "COMPOUND": 9,
        "USER": 10,
        "ENCRYPTED": 11,
        "ENCRYPTED_CHUNKS": 12,
    }
    assert {s.name: s.value for s in MemberState} == {"ALIVE": 0, "SUSPECT": 1, "DEAD": 2, "LEFT": 3}


def test_a_push_pull_is_bounded_before_protobuf_parses_it() -> None:
    # 10,001 empty members are 20 KB: protobuf would make 10,001 objects before anything counted them.
    many = bytes([MessageType.PUSH_PULL]) + b"\x08\x00" + b"\x12\x00" * (MAX_MEMBERS + 1) + b"\x1a\x00"
    with pytest.raises(DecodeError, match=f"more than {MAX_MEMBERS}"):
        open_frame(seal_frame(many, None), None)
    # One member padded with an unknown field (15) past MAX_PUSH_PULL_MEMBER_BYTES; protobuf keeps it.
    member = pb.PushPullMember()
    valid = pb.PushPullMember(
        name="a", addr="10.0.0.1:1", meta=pb.NodeMeta(http_addr="", version=""), incarnation=1, state=0
    )
    member.ParseFromString(valid.SerializeToString() + b"\x7a\x80\x08" + bytes(1024))
    assert member.ByteSize() > MAX_PUSH_PULL_MEMBER_BYTES
    big = bytes([MessageType.PUSH_PULL]) + pb.PushPull(join=False, members=[member], user_state=b"").SerializeToString()
    with pytest.raises(DecodeError, match="exceeds"):
        open_frame(seal_frame(big, None), None)
    # The same member without the padding decodes.
    ok = bytes([MessageType.PUSH_PULL]) + pb.PushPull(join=False, members=[valid], user_state=b"").SerializeToString()
    assert open_frame(seal_frame(ok, None), None) == PushPull(
        False, (PushPullMember("a", "10.0.0.1:1", NodeMeta(), 1, MemberState.ALIVE),), b""
    )
