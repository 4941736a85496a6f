"""Member addresses as "host:port" strings: split, join, and the hosts that mean "every interface".

Kept apart from `mesh.transport` (sockets, TLS, codec) so configuration code can check addresses without
importing the runtime.
"""

from __future__ import annotations

import functools

WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})


@functools.lru_cache(maxsize=4096)
def split_addr(addr: str) -> tuple[str, int]:
    """ "host:port" -> (host, port); brackets around an IPv6 host are removed. Raises ValueError."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"expected host:port, got {addr!r}")
    return host.strip("[]"), int(port)


def join_addr(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
