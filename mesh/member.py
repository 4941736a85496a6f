"""What a member is: its state, its bounded metadata, and the immutable snapshot the API hands out."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum

from mesh.limits import MAX_ADDR_BYTES, MAX_META_BYTES, MAX_META_STRING_BYTES, MAX_NAME_BYTES, MAX_ROLES


class MemberState(IntEnum):
    """A member's state in one node's view. The values are on the wire (push-pull): append only."""

    ALIVE = 0
    SUSPECT = 1
    DEAD = 2
    #: Left gracefully: announced its own departure, so it is not a failure.
    LEFT = 3

    @property
    def is_gone(self) -> bool:
        return self in (MemberState.DEAD, MemberState.LEFT)


def _str_bytes(value: str, what: str, limit: int) -> int:
    """UTF-8 size of ``value``. Raises ValueError past ``limit`` bytes or for an unprintable character (control
    characters, line separators: names and labels end up in logs, tables and metrics labels)."""
    size = len(value.encode("utf-8"))
    if size > limit:
        raise ValueError(f"{what}: {size} bytes exceeds the limit of {limit}")
    if not value.isprintable():
        raise ValueError(f"{what}: unprintable character in {value!r}")
    return size


def check_name(name: str) -> None:
    """Raises ValueError if a member name is empty, unprintable or longer than MAX_NAME_BYTES."""
    if not name:
        raise ValueError("member name: must not be empty")
    _str_bytes(name, "member name", MAX_NAME_BYTES)


def check_addr(addr: str) -> None:
    """Raises ValueError if an address is not "host:port" within MAX_ADDR_BYTES (host may be a DNS name:
    seeds given to join)."""
    _str_bytes(addr, "member address", MAX_ADDR_BYTES)
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise ValueError(f"member address: expected host:port, got {addr!r}")


def check_member_addr(addr: str) -> None:
    """Raises ValueError unless ``addr`` is "ip:port" with a literal IPv4 or bracketed IPv6 address that can
    be sent to: a member's address as gossiped. Never a name (resolving it would block the event loop, and
    a hostile one could make us resolve without end), nor an unspecified, multicast or broadcast address
    (a forged member there would turn our probes into traffic to everyone)."""
    check_addr(addr)
    host = addr.rpartition(":")[0]
    bracketed = host.startswith("[") and host.endswith("]")
    try:
        ip = ipaddress.ip_address(host[1:-1] if bracketed else host)
    except ValueError:
        raise ValueError(f"member address: expected a literal IP address, got {addr!r}") from None
    if bracketed != (ip.version == 6):
        raise ValueError(f"member address: IPv6 addresses are bracketed, IPv4 ones are not, got {addr!r}")
    if ip.is_unspecified or ip.is_multicast or ip == ipaddress.IPv4Address("255.255.255.255"):
        raise ValueError(f"member address: {ip} cannot be a member's address")


@dataclass(frozen=True, slots=True)
class NodeMeta:
    """Application metadata gossiped with a member. Encoded size is at most MAX_META_BYTES.

    The mesh never interprets it: ``http_addr`` and ``version`` are what every gateway node publishes,
    ``roles`` is a small ordered label map (e.g. ``{"zone": "a", "gpu": "h100"}``).
    """

    http_addr: str = ""
    version: str = ""
    roles: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if len(self.roles) > MAX_ROLES:
            raise ValueError(f"roles: {len(self.roles)} entries exceeds the limit of {MAX_ROLES}")
        if len({key for key, _ in self.roles}) != len(self.roles):
            raise ValueError("roles: duplicate key")
        # Counted as wire version 1 encoded it (a length byte per string, one for the role count); protobuf
        # adds at most ~120 B of tags and lengths to this (MAX_PUSH_PULL_MEMBER_BYTES accounts for them).
        size = 1 + sum(
            1 + _str_bytes(s, "metadata string", MAX_META_STRING_BYTES) for s in (self.http_addr, self.version)
        )
        for key, value in self.roles:
            size += 2 + _str_bytes(key, "role key", MAX_META_STRING_BYTES)
            size += _str_bytes(value, "role value", MAX_META_STRING_BYTES)
        if size > MAX_META_BYTES:
            raise ValueError(f"metadata: {size} encoded bytes exceeds the limit of {MAX_META_BYTES}")

    @classmethod
    def create(cls, http_addr: str = "", version: str = "", roles: Mapping[str, str] | None = None) -> NodeMeta:
        """Raises ValueError if the metadata would not fit MAX_META_BYTES or has too many roles."""
        return cls(http_addr, version, tuple((roles or {}).items()))

    @property
    def roles_dict(self) -> dict[str, str]:
        return dict(self.roles)


@dataclass(frozen=True, slots=True)
class Member:
    """An immutable snapshot of one member as one node sees it.

    ``state_change_s`` is on the clock of the node that took the snapshot (the event loop's monotonic clock
    in the asyncio shell, virtual time in the simulator).
    """

    name: str
    addr: str
    meta: NodeMeta = field(default_factory=NodeMeta)
    state: MemberState = MemberState.ALIVE
    incarnation: int = 0
    state_change_s: float = 0.0

    @property
    def http_addr(self) -> str:
        return self.meta.http_addr

    @property
    def version(self) -> str:
        return self.meta.version

    @property
    def roles(self) -> dict[str, str]:
        return self.meta.roles_dict
