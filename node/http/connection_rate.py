"""How often one client address may open a connection: a token bucket per address. Pure: the caller passes
the time.

A bucket holds up to ``burst`` tokens and gains ``rate_per_s`` a second; a connection takes one, and finds
none only when its address opened more than ``burst`` connections faster than the rate. Clients and load
balancers keep connections alive, so the limit is set far above what they open; what it stops is one
address opening connections in a loop (each costs an accept, a handler and, with TLS, a handshake) faster
than the connection cap's eviction can make room for everyone else.

Addresses inside ``exempt`` networks are never limited (a sidecar proxy on loopback, or a load balancer that
does not reuse upstream connections). IPv6 clients are counted per /64, as one host commonly holds a whole
/64 and could otherwise make up a fresh address per connection.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

#: Addresses with a bucket at most. Past it the least recently seen one is forgotten; its bucket has most
#: likely refilled (it was untouched for the longest), so forgetting loses nothing unless this many addresses
#: connected within burst / rate seconds: a distributed flood, which no per-address limit stops (the
#: connection cap does). ~150 bytes each: ~10 MB at most.
MAX_ADDRESSES = 65_536
#: The prefix an IPv6 client is counted by.
IPV6_PREFIX_BITS = 64


class ConnectionRate:
    """Token buckets, one per client address (or IPv6 /64), in least-recently-seen order."""

    def __init__(
        self,
        rate_per_s: float,
        burst: int,
        exempt: Iterable[IpNetwork] = (),
        *,
        max_addresses: int = MAX_ADDRESSES,
    ) -> None:
        """Raises ValueError when ``rate_per_s`` <= 0 or ``burst`` < 1."""
        if not rate_per_s > 0 or burst < 1:
            raise ValueError("rate_per_s must be > 0 and burst >= 1")
        self._rate_per_s = rate_per_s
        self._burst = float(burst)
        self._exempt = tuple(exempt)
        self._max_addresses = max_addresses
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, at); insertion order = last seen

    def __len__(self) -> int:
        return len(self._buckets)

    def allow(self, address: str, now: float) -> bool:
        """Whether a connection from ``address`` (the peer's IP, as the socket gives it) may be served at
        ``now``; takes a token when it may. An address that is not an IP (a Unix socket) is not limited."""
        key = self._key(address)
        if key is None:
            return True
        found = self._buckets.pop(key, None)
        if found is None:
            tokens = self._burst
            if len(self._buckets) >= self._max_addresses:
                del self._buckets[next(iter(self._buckets))]
        else:
            tokens = min(self._burst, found[0] + (now - found[1]) * self._rate_per_s)
        allowed = tokens >= 1.0
        self._buckets[key] = (tokens - 1.0 if allowed else tokens, now)
        return allowed

    def _key(self, address: str) -> str | None:
        try:
            ip = ipaddress.ip_address(address.partition("%")[0])
        except ValueError:
            return None
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if any(ip in net for net in self._exempt):
            return None
        if isinstance(ip, ipaddress.IPv6Address):
            return str(ipaddress.IPv6Network((ip, IPV6_PREFIX_BITS), strict=False).network_address) + "/64"
        return str(ip)
