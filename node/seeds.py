"""Seed addresses by name: `--join node:7946` where `node` is a DNS name (a compose service, a Kubernetes
headless Service), resolved when the node joins and again on every retry.

The mesh itself speaks literal addresses only (members are named by the address they advertise); names stop
here, in the node layer. A name may stand for several members (a scaled service): every address it resolves to
is a seed, except our own. A name that does not resolve yet (its containers are still starting) is skipped for
this round, not an error: the next round resolves it again.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable, Sequence

from mesh.transport import WILDCARD_HOSTS, join_addr, split_addr

log = logging.getLogger(__name__)

# A resolver: (host, port) -> the IP addresses it stands for. Raises OSError when the name does not resolve.
Resolver = Callable[[str, int], Awaitable[list[str]]]
# DNS answers for one name beyond this many are ignored: a seed list needs a few live members, not all of them.
MAX_ADDRS_PER_NAME = 16


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


async def advertise_host(bind_host: str, advertise_host: str, *, resolver: Resolver = system_resolver) -> str:
    """The literal address peers reach us at: ``advertise_host`` resolved if it is a name; with neither it nor
    a specific bind address, the address our own host name resolves to (a container's address on its network).
    Raises OSError if a name does not resolve."""
    host = advertise_host or ("" if bind_host in WILDCARD_HOSTS else bind_host)
    if not host:
        host = socket.gethostname()
    if is_ip(host):
        return host
    try:
        addrs = await resolver(host, 0)
    except OSError as exc:
        raise OSError(f"mesh: the advertise host {host!r} does not resolve ({exc.strerror or exc})") from exc
    if not addrs:
        raise OSError(f"mesh: the advertise host {host!r} resolves to no address")
    return addrs[0]
