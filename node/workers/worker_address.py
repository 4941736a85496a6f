"""Where a worker URL's host name leads, held to the worker network policy before any connection is made.

A name is resolved here (``getaddrinfo`` on the loop's default executor, so the event loop never waits on DNS,
within ``RESOLVE_TIMEOUT_S``), and every address it resolves to must pass the ``NetworkPolicy``: one address in
a forbidden range refuses the whole name, since a channel may use any of them. The worker client then connects
to exactly the addresses checked here (``PinnedTarget``), never to the name: a resolver asked again at
connect time could answer differently (DNS rebinding), so it is never asked.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from node.workers.worker_url import IpAddress, NetworkPolicy, WorkerTarget, unmapped

#: One name's resolution, bounded: a resolver that does not answer within this long fails it (its executor
#: thread may run on; getaddrinfo cannot be cancelled).
RESOLVE_TIMEOUT_S = 5.0
#: Addresses kept per name: the channel tries them in order; a longer answer adds nothing but memory.
MAX_ADDRESSES = 16

#: host name -> its addresses, in the resolver's order. Raises OSError when the name does not resolve.
Resolver = Callable[[str], Awaitable[Sequence[IpAddress]]]


class WorkerAddressError(ValueError):
    """A worker's address lies outside the network policy; the message names the URL and the address."""


class WorkerUnresolved(WorkerAddressError):
    """A worker's name does not resolve (now): no address, a resolver error or no answer in time."""


async def system_resolve(host: str) -> tuple[IpAddress, ...]:
    """The system resolver's addresses for ``host`` (hosts file, then DNS), without blocking the loop."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return tuple(dict.fromkeys(ipaddress.ip_address(str(info[4][0]).partition("%")[0]) for info in infos))


@dataclass(frozen=True, slots=True)
class PinnedTarget:
    """The checked addresses a worker's connections go to, and the name its TLS and :authority carry."""

    target: WorkerTarget
    addresses: tuple[IpAddress, ...]

    def grpc_target(self) -> str:
        """A grpc target naming the addresses themselves (``ipv4:a:p,b:p``), so grpc resolves nothing.
        One family per target (grpc's syntax): IPv4 when the name has any, else IPv6."""
        v4 = [ip for ip in self.addresses if ip.version == 4]
        if v4:
            return "ipv4:" + ",".join(f"{ip}:{self.target.port}" for ip in v4)
        return "ipv6:" + ",".join(f"[{ip}]:{self.target.port}" for ip in self.addresses)

    @property
    def first(self) -> str:
        """The address the h2 transport connects to."""
        return str(self.addresses[0])


async def checked_addresses(
    url: str,
    target: WorkerTarget,
    policy: NetworkPolicy,
    *,
    resolve: Resolver = system_resolve,
    timeout_s: float = RESOLVE_TIMEOUT_S,
) -> PinnedTarget:
    """The addresses ``url`` (parsed: ``target``) leads to, each inside ``policy``.

    Raises WorkerUnresolved when the name does not resolve (within ``timeout_s``), WorkerAddressError when
    one of its addresses lies outside the policy.
    """
    if target.ip is not None:
        try:
            policy.check(url, target)
        except ValueError as exc:
            raise WorkerAddressError(str(exc)) from None
        return PinnedTarget(target, (target.ip,))
    try:
        async with asyncio.timeout(timeout_s):
            found = await resolve(target.host)
    except TimeoutError:
        raise WorkerUnresolved(f"worker URL {url!r}: {target.host} did not resolve within {timeout_s:g} s") from None
    except OSError as exc:
        raise WorkerUnresolved(f"worker URL {url!r}: {target.host} does not resolve ({exc})") from None
    addresses = tuple(dict.fromkeys(unmapped(ip) for ip in found))
    if not addresses:
        raise WorkerUnresolved(f"worker URL {url!r}: {target.host} resolves to no address")
    for ip in addresses:
        try:
            policy.check_address(url, ip, via=target.host)
        except ValueError as exc:
            raise WorkerAddressError(str(exc)) from None
    return PinnedTarget(target, addresses[:MAX_ADDRESSES])
