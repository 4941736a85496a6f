"""Seed addresses by name: `--join node:7946` where `node` is a DNS name (a compose service, a Kubernetes
headless Service), resolved when the node joins and again on every retry.

The mesh itself speaks literal addresses only (members are named by the address they advertise, and gossip
never carries a name); names stop here, in the node layer. A name may stand for several members (a scaled
service): every address it resolves to is a seed, except our own. A name that does not resolve yet (its
containers are still starting) is skipped for this round, not an error: the next round resolves it again.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable, Sequence

from mesh import join_addr

log = logging.getLogger(__name__)

# A resolver: (host, port) -> the IP addresses it stands for. Raises OSError when the name does not resolve.
Resolver = Callable[[str, int], Awaitable[list[str]]]
# DNS answers for one name beyond this many are ignored: a seed list needs a few live members, not all of them.
MAX_ADDRS_PER_NAME = 16


def split_addr(addr: str) -> tuple[str, int]:
    """ "host:port" -> (host, port), brackets around an IPv6 host removed. Raises ValueError."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"expected host:port, got {addr!r}")
    return host.strip("[]"), int(port)


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


async def system_resolver(host: str, port: int) -> list[str]:
    """The system resolver (getaddrinfo, on the loop's executor). Raises OSError (socket.gaierror)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


async def resolve_seeds(peers: Sequence[str], *, own: str = "", resolver: Resolver = system_resolver) -> list[str]:
    """The literal ``ip:port`` seeds ``peers`` stand for now, in order, without duplicates or ``own`` (our
    advertised address). Literal addresses pass unchanged; names that do not resolve are logged and skipped.
    Raises ValueError for a peer that is not host:port."""
    out: list[str] = []
    for peer in peers:
        host, port = split_addr(peer)
        if is_ip(host):
            candidates = [join_addr(host, port)]
        else:
            try:
                addrs = await resolver(host, port)
            except OSError as exc:
                log.info("seed %s does not resolve yet (%s)", peer, exc)
                continue
            candidates = [join_addr(addr, port) for addr in addrs[:MAX_ADDRS_PER_NAME]]
        out += [addr for addr in candidates if addr != own and addr not in out]
    return out


async def host_address(host: str = "", *, resolver: Resolver = system_resolver) -> str:
    """The literal address of ``host`` (default: this machine's own name; in a container, its address on its
    network): what a member bound to a wildcard address advertises when no --mesh-advertise is given.
    Raises OSError if the name does not resolve."""
    host = host or socket.gethostname()
    if is_ip(host):
        return host
    try:
        addrs = await resolver(host, 0)
    except OSError as exc:
        raise OSError(f"mesh: the advertise host {host!r} does not resolve ({exc.strerror or exc})") from exc
    if not addrs:
        raise OSError(f"mesh: the advertise host {host!r} resolves to no address")
    return addrs[0]
