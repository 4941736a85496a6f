"""DNS messages, sans-IO: a query for A, AAAA or SRV records of one name, and the answer's records.

Only what worker discovery needs (RFC 1035 framing, RFC 2782 SRV, RFC 3596 AAAA); compression pointers are
followed with a hop bound so a hostile answer cannot loop. Raises DnsFormatError on any malformed message.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass
from enum import IntEnum


class QType(IntEnum):
    A = 1
    AAAA = 28
    SRV = 33


CLASS_IN = 1
#: A classic UDP answer fits this; a truncated one (TC) is asked again over TCP (RFC 7766).
MAX_UDP_BYTES = 512
#: A TCP answer is at most this long (its 2-byte length prefix allows 64 KiB).
MAX_TCP_BYTES = 65535
#: Compression pointers followed in one name before it is refused (a loop otherwise).
MAX_POINTER_HOPS = 32
MAX_NAME_BYTES = 255
#: Records read from one answer; more is refused rather than parsed.
MAX_RECORDS = 1024
_HEADER = struct.Struct("!HHHHHH")
_FLAG_QR, _FLAG_TC, _FLAG_RD = 0x8000, 0x0200, 0x0100
RCODE_NXDOMAIN = 3


class DnsFormatError(ValueError):
    """A message that is not a well-formed DNS answer to our query."""


@dataclass(frozen=True, slots=True)
class Srv:
    priority: int
    weight: int
    port: int
    target: str


@dataclass(frozen=True, slots=True)
class Answer:
    id: int
    truncated: bool
    rcode: int
    addresses: dict[str, tuple[str, ...]]  # owner name -> A/AAAA addresses (answer and additional sections)
    srv: tuple[Srv, ...]


def _encode_name(name: str) -> bytes:
    out = bytearray()
    for label in name.rstrip(".").split("."):
        raw = label.encode("idna") if label else b""
        if not raw or len(raw) > 63:
            raise ValueError(f"bad DNS name {name!r}")
        out += bytes([len(raw)]) + raw
    out += b"\0"
    if len(out) > MAX_NAME_BYTES:
        raise ValueError(f"DNS name {name!r} longer than {MAX_NAME_BYTES} bytes")
    return bytes(out)


def check_name(name: str) -> None:
    """Raises ValueError when ``name`` cannot be asked for."""
    _encode_name(name)


def encode_query(qid: int, name: str, qtype: QType) -> bytes:
    return _HEADER.pack(qid, _FLAG_RD, 1, 0, 0, 0) + _encode_name(name) + struct.pack("!HH", qtype, CLASS_IN)


def _read_name(msg: bytes, offset: int) -> tuple[str, int]:
    labels: list[str] = []
    end: int | None = None
    hops = 0
    total = 0
    while True:
        if offset >= len(msg):
            raise DnsFormatError("name runs past the message")
        length = msg[offset]
        if length & 0xC0 == 0xC0:
            if offset + 1 >= len(msg):
                raise DnsFormatError("cut compression pointer")
            hops += 1
            if hops > MAX_POINTER_HOPS:
                raise DnsFormatError("compression pointer loop")
            if end is None:
                end = offset + 2
            offset = ((length & 0x3F) << 8) | msg[offset + 1]
            continue
        if length & 0xC0:
            raise DnsFormatError("unknown label type")
        offset += 1
        if length == 0:
            break
        total += length + 1
        if total > MAX_NAME_BYTES or offset + length > len(msg):
            raise DnsFormatError("name too long or cut")
        labels.append(msg[offset : offset + length].decode("ascii", errors="replace").lower())
        offset += length
    return ".".join(labels), end if end is not None else offset


def decode_answer(msg: bytes, qid: int) -> Answer:
    """The records of an answer to query ``qid``. Raises DnsFormatError."""
    if len(msg) < _HEADER.size:
        raise DnsFormatError("shorter than a DNS header")
    rid, flags, qd, an, ns, ar = _HEADER.unpack_from(msg)
    if rid != qid or not flags & _FLAG_QR:
        raise DnsFormatError("not the answer to our query")
    if an + ns + ar > MAX_RECORDS:
        raise DnsFormatError(f"more than {MAX_RECORDS} records")
    offset = _HEADER.size
    for _ in range(qd):
        _, offset = _read_name(msg, offset)
        offset += 4
    addresses: dict[str, list[str]] = {}
    srv: list[Srv] = []
    for _ in range(an + ns + ar):
        owner, offset = _read_name(msg, offset)
        if offset + 10 > len(msg):
            raise DnsFormatError("cut record header")
        rtype, rclass, _ttl, rdlen = struct.unpack_from("!HHIH", msg, offset)
        offset += 10
        rdata_end = offset + rdlen
        if rdata_end > len(msg):
            raise DnsFormatError("cut record data")
        if rclass == CLASS_IN and rtype == QType.A and rdlen == 4:
            addresses.setdefault(owner, []).append(str(ipaddress.IPv4Address(msg[offset:rdata_end])))
        elif rclass == CLASS_IN and rtype == QType.AAAA and rdlen == 16:
            addresses.setdefault(owner, []).append(str(ipaddress.IPv6Address(msg[offset:rdata_end])))
        elif rclass == CLASS_IN and rtype == QType.SRV and rdlen >= 7:
            priority, weight, port = struct.unpack_from("!HHH", msg, offset)
            target, _ = _read_name(msg, offset + 6)
            srv.append(Srv(priority, weight, port, target))
        offset = rdata_end
    return Answer(
        id=rid,
        truncated=bool(flags & _FLAG_TC),
        rcode=flags & 0x000F,
        addresses={k: tuple(v) for k, v in addresses.items()},
        srv=tuple(srv),
    )
