"""The mesh wire format's framing: versioned, bounded, hand-written around protobuf bodies.

Packet (UDP), at most MAX_PACKET_BYTES::

    plaintext:  version:u8  message
    encrypted:  version:u8  ENCRYPTED:u8  nonce[12]  AES-GCM(message)+tag[16]     aad = version, ENCRYPTED
    message:    type:u8 body                           (one of MessageType)
    compound:   COMPOUND:u8 count:u8 (len:u16)*count part*count    (parts are messages, never compound)

Stream frame (TCP), one request and one reply per connection::

    version:u8 type:u8 length:u32 payload[length]
    encrypted:  type = ENCRYPTED, payload = nonce AES-GCM(type:u8 body)+tag, aad = the 6 header bytes
                (messages up to STREAM_SEAL_CHUNK_BYTES), or
                type = ENCRYPTED_CHUNKS, payload = (nonce AES-GCM(chunk)+tag)*n: type:u8 body cut into chunks of
                STREAM_SEAL_CHUNK_BYTES (the last shorter), chunk i sealed with aad = header u32(i) u8(i == n-1)
    A receiver authenticates the first sealed chunk (``check_frame_prefix``) before reading the rest, so a
    stranger cannot make it buffer a large frame; index and last flag in the aad stop reordering, dropping
    or appending chunks.

Integers are big-endian. A body is the protobuf message of its type in proto/mesh.proto, encoded and
validated by :mod:`mesh.bodies`. Decoders raise DecodeError for anything truncated, oversized, of an
unknown version or type, or otherwise malformed; size caps are checked here before a body is parsed.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Sequence

from mesh.bodies import DECODERS, encode_message
from mesh.errors import DecodeError, DecryptError
from mesh.keyring import Keyring
from mesh.limits import (
    COMPOUND_HEADER_BYTES,
    COMPOUND_PART_OVERHEAD,
    MAX_COMPOUND_PARTS,
    MAX_PACKET_BYTES,
    MAX_PREAUTH_BYTES,
    MAX_STREAM_FRAME_BYTES,
    NONCE_BYTES,
    PROTOCOL_VERSION,
    STREAM_HEADER_BYTES,
    STREAM_SEAL_CHUNK_BYTES,
    TAG_BYTES,
)
from mesh.messages import Message, MessageType

__all__ = [
    "check_frame_prefix",
    "compound",
    "compound_size",
    "decode_messages",
    "encode_message",
    "frame_length",
    "open_frame",
    "open_packet",
    "seal_frame",
    "seal_packet",
]

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_HEADER = struct.Struct(">BBI")
_VERSION = bytes([PROTOCOL_VERSION])
_ENCRYPTED_AAD = bytes([PROTOCOL_VERSION, MessageType.ENCRYPTED])

# -- encoding ---------------------------------------------------------------------------------------------


def compound(parts: Sequence[bytes]) -> bytes:
    """One message from several encoded messages (a single part is returned as is)."""
    if len(parts) == 1:
        return parts[0]
    if not 0 < len(parts) <= MAX_COMPOUND_PARTS:
        raise ValueError(f"compound of {len(parts)} parts")
    out = bytearray((MessageType.COMPOUND, len(parts)))
    for part in parts:
        out += _U16.pack(len(part))
    for part in parts:
        out += part
    return bytes(out)


def compound_size(part_sizes: int, count: int) -> int:
    """Encoded size of a compound of ``count`` parts totalling ``part_sizes`` bytes."""
    if count == 1:
        return part_sizes
    return COMPOUND_HEADER_BYTES + count * COMPOUND_PART_OVERHEAD + part_sizes


def seal_packet(message: bytes, keyring: Keyring | None) -> bytes:
    """A packet from one encoded (possibly compound) message, encrypted if a keyring is given."""
    if keyring is None:
        return _VERSION + message
    return _ENCRYPTED_AAD + keyring.seal(message, _ENCRYPTED_AAD)


def seal_frame(message: bytes, keyring: Keyring | None) -> bytes:
    """A stream frame from one encoded message (type byte first), encrypted if a keyring is given: sealed
    whole when it fits one chunk (what every version reads), else in chunks (ENCRYPTED_CHUNKS)."""
    if keyring is None:
        msg_type, body = message[0], message[1:]
        return _HEADER.pack(PROTOCOL_VERSION, msg_type, len(body)) + body
    if len(message) <= STREAM_SEAL_CHUNK_BYTES:
        # The sealed payload's length is known before sealing: nonce + plaintext + tag.
        sealed_len = len(message) + NONCE_BYTES + TAG_BYTES
        header = _HEADER.pack(PROTOCOL_VERSION, MessageType.ENCRYPTED, sealed_len)
        return header + keyring.seal(message, header)
    chunks = [message[i : i + STREAM_SEAL_CHUNK_BYTES] for i in range(0, len(message), STREAM_SEAL_CHUNK_BYTES)]
    header = _HEADER.pack(
        PROTOCOL_VERSION, MessageType.ENCRYPTED_CHUNKS, len(message) + len(chunks) * (NONCE_BYTES + TAG_BYTES)
    )
    out = bytearray(header)
    for index, chunk in enumerate(chunks):
        out += keyring.seal(chunk, _chunk_aad(header, index, index == len(chunks) - 1))
    return bytes(out)


def _chunk_aad(header: bytes, index: int, last: bool) -> bytes:
    return header + _U32.pack(index) + (b"\x01" if last else b"\x00")


def _chunk_spans(length: int) -> list[int]:
    """Sizes of the sealed chunks of an ENCRYPTED_CHUNKS payload of ``length`` bytes. Raises DecodeError."""
    full = MAX_PREAUTH_BYTES
    spans = [full] * (length // full)
    rest = length % full
    if rest:
        if rest <= NONCE_BYTES + TAG_BYTES:
            raise DecodeError("sealed chunk shorter than nonce + tag")
        spans.append(rest)
    if not spans:
        raise DecodeError("empty chunked frame")
    return spans


def _open_chunks(header: bytes, payload: bytes, keyring: Keyring) -> bytes:
    spans = _chunk_spans(len(payload))
    out = bytearray()
    pos = 0
    for index, size in enumerate(spans):
        out += keyring.open(payload[pos : pos + size], _chunk_aad(header, index, index == len(spans) - 1))
        pos += size
    return bytes(out)


# -- decoding ---------------------------------------------------------------------------------------------


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes, pos: int = 0) -> None:
        self.buf = buf
        self.pos = pos

    def u8(self) -> int:
        if self.pos >= len(self.buf):
            raise DecodeError("truncated")
        value = self.buf[self.pos]
        self.pos += 1
        return value

    def u16(self) -> int:
        end = self.pos + 2
        if end > len(self.buf):
            raise DecodeError("truncated")
        (value,) = _U16.unpack_from(self.buf, self.pos)
        self.pos = end
        return int(value)

    def take(self, size: int) -> bytes:
        end = self.pos + size
        if end > len(self.buf):
            raise DecodeError("truncated")
        value = self.buf[self.pos : end]
        self.pos = end
        return value


#: Types that may travel in a packet; PUSH_PULL only travels over streams.
_PACKET_TYPES = frozenset(DECODERS) - {MessageType.PUSH_PULL}


#: Gossip reaches each member ~retransmit-limit times, byte for byte the same: decoding is pure, so the
#: membership updates are decoded once per distinct encoding. The cache is bounded (LRU).
_GOSSIP_TYPES = frozenset({MessageType.ALIVE, MessageType.SUSPECT, MessageType.DEAD})
_GOSSIP_CACHE_SIZE = 4096


@functools.lru_cache(maxsize=_GOSSIP_CACHE_SIZE)
def _decode_gossip(buf: bytes) -> Message:
    return DECODERS[buf[0]](buf[1:])


def _decode_one(buf: bytes, allowed: frozenset[int]) -> Message:
    if not buf:
        raise DecodeError("empty message")
    if buf[0] in _GOSSIP_TYPES:
        return _decode_gossip(buf)
    decoder = DECODERS.get(buf[0]) if buf[0] in allowed else None
    if decoder is None:
        raise DecodeError(f"unexpected message type {buf[0]}")
    return decoder(buf[1:])


def decode_messages(message: bytes) -> list[Message]:
    """Decode one packet-level message (a single message or a compound). Raises DecodeError."""
    if message and message[0] == MessageType.COMPOUND:
        r = _Reader(message, 1)
        count = r.u8()
        if not 0 < count <= MAX_COMPOUND_PARTS:
            raise DecodeError(f"compound of {count} parts")
        sizes = [r.u16() for _ in range(count)]
        return [_decode_one(r.take(size), _PACKET_TYPES) for size in sizes]
    return [_decode_one(message, _PACKET_TYPES)]


def open_packet(data: bytes, keyring: Keyring | None) -> list[Message]:
    """Decode a packet. With a keyring, only encrypted packets are accepted.

    Raises DecodeError (malformed/oversized/wrong version) or DecryptError (unauthenticated).
    """
    if len(data) > MAX_PACKET_BYTES:
        raise DecodeError(f"packet of {len(data)} bytes exceeds {MAX_PACKET_BYTES}")
    if len(data) < 2:
        raise DecodeError("packet too short")
    if data[0] != PROTOCOL_VERSION:
        raise DecodeError(f"unsupported protocol version {data[0]}")
    encrypted = data[1] == MessageType.ENCRYPTED
    if keyring is not None:
        if not encrypted:
            raise DecryptError("unencrypted packet while a keyring is configured")
        return decode_messages(keyring.open(data[2:], _ENCRYPTED_AAD))
    if encrypted:
        raise DecryptError("encrypted packet but no keyring is configured")
    return decode_messages(data[1:])


_SEALED_FRAME_TYPES = frozenset({MessageType.ENCRYPTED, MessageType.ENCRYPTED_CHUNKS})


def frame_length(header: bytes) -> int:
    """Payload length announced by a stream frame header. Raises DecodeError if it is unacceptable."""
    if len(header) != STREAM_HEADER_BYTES:
        raise DecodeError("short frame header")
    version, msg_type, length = _HEADER.unpack(header)
    if version != PROTOCOL_VERSION:
        raise DecodeError(f"unsupported protocol version {version}")
    if msg_type not in DECODERS and msg_type not in _SEALED_FRAME_TYPES:
        raise DecodeError(f"unexpected frame type {msg_type}")
    if length > MAX_STREAM_FRAME_BYTES:
        raise DecodeError(f"frame of {length} bytes exceeds {MAX_STREAM_FRAME_BYTES}")
    return int(length)


def open_frame(frame: bytes, keyring: Keyring | None) -> Message:
    """Decode a whole stream frame (header + payload). Raises DecodeError or DecryptError."""
    header = frame[:STREAM_HEADER_BYTES]
    length = frame_length(header)
    payload = frame[STREAM_HEADER_BYTES:]
    if len(payload) != length:
        raise DecodeError("frame length does not match its header")
    msg_type = header[1]
    stream_types = frozenset(DECODERS)
    if keyring is not None:
        if msg_type == MessageType.ENCRYPTED:
            return _decode_one(keyring.open(payload, header), stream_types)
        if msg_type == MessageType.ENCRYPTED_CHUNKS:
            return _decode_one(_open_chunks(header, payload, keyring), stream_types)
        raise DecryptError("unencrypted frame while a keyring is configured")
    if msg_type in _SEALED_FRAME_TYPES:
        raise DecryptError("encrypted frame but no keyring is configured")
    return _decode_one(bytes([msg_type]) + payload, stream_types)


def check_frame_prefix(prefix: bytes, keyring: Keyring | None) -> None:
    """Authenticate an inbound frame from its header and first ``min(length, MAX_PREAUTH_BYTES)`` payload
    bytes, before the rest is read; given the header alone, check what it tells (its type).

    With a keyring the frame must be encrypted and its first sealed chunk must open (a frame sealed whole
    must fit MAX_PREAUTH_BYTES: an older node's larger one cannot be authenticated before it is buffered).
    Without one there is nothing to authenticate, but an encrypted frame is refused at once. Raises
    DecodeError or DecryptError."""
    header, first = prefix[:STREAM_HEADER_BYTES], prefix[STREAM_HEADER_BYTES:]
    length = frame_length(header)
    msg_type = header[1]
    if keyring is None:
        if msg_type in _SEALED_FRAME_TYPES:
            raise DecryptError("encrypted frame but no keyring is configured")
        return
    if msg_type not in _SEALED_FRAME_TYPES:
        raise DecryptError("unencrypted frame while a keyring is configured")
    if not first and length:
        return  # the header alone: its type is acceptable; the payload is checked when it is here
    if msg_type == MessageType.ENCRYPTED:
        if length > len(first):
            raise DecryptError(
                f"frame sealed whole is {length} bytes, over {MAX_PREAUTH_BYTES}: not authenticable first"
            )
        keyring.open(first, header)
    else:
        spans = _chunk_spans(length)
        keyring.open(first[: spans[0]], _chunk_aad(header, 0, len(spans) == 1))
