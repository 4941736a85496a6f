"""Workers by DNS (``--worker-dns NAME:PORT`` or ``--worker-dns NAME``): resolved every interval, registered in
the cluster's registry, removed when the name no longer names them.

``NAME:PORT``: every A/AAAA address of NAME is a worker on PORT (a Kubernetes headless Service: one address
per ready pod). ``NAME``: its SRV records name the workers' hosts and ports. Names are fully qualified (no
search domains). Workers found this way carry the label ``smg.discovery=dns:<target>``; only such workers are
ever removed by it, and only after an answer that no longer lists them: when the DNS server cannot be reached,
nothing changes (a DNS outage must not empty the cluster).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import random
import struct
from collections.abc import Sequence
from pathlib import Path

from node.cluster.registry import WorkerRegistry, WorkerSpec
from node.discovery.config import DnsTarget
from node.discovery.dns_wire import (
    MAX_TCP_BYTES,
    RCODE_NXDOMAIN,
    Answer,
    DnsFormatError,
    QType,
    decode_answer,
    encode_query,
)
from node.discovery.registry_sync import sync_owned

log = logging.getLogger(__name__)

RESOLV_CONF = Path("/etc/resolv.conf")
DNS_PORT = 53


class DnsUnavailable(Exception):
    """No usable answer (timeout, unreachable server, malformed or failed answer): keep what we have."""


def system_nameserver(path: Path = RESOLV_CONF) -> tuple[str, int]:
    """The first ``nameserver`` of resolv.conf (what the system resolver asks). Raises OSError/ValueError."""
    for line in path.read_text(encoding="utf-8").splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "nameserver":
            return parts[1], DNS_PORT
    raise ValueError(f"{path} names no nameserver")


class _Udp(asyncio.DatagramProtocol):
    def __init__(self, reply: asyncio.Future[bytes]) -> None:
        self._reply = reply

    def datagram_received(self, data: bytes, addr: tuple[str | object, ...]) -> None:
        if not self._reply.done():
            self._reply.set_result(data)

    def error_received(self, exc: Exception) -> None:
        if not self._reply.done():
            self._reply.set_exception(exc)


class DnsClient:
    """Asks one server; UDP first, TCP when the answer was truncated."""

    def __init__(self, server: tuple[str, int], *, timeout_s: float, rng: random.Random | None = None) -> None:
        self._server = server
        self._timeout_s = timeout_s
        self._rng = rng or random.Random()

    async def query(self, name: str, qtype: QType) -> Answer:
        """Raises DnsUnavailable."""
        qid = self._rng.randrange(1 << 16)
        query = encode_query(qid, name, qtype)
        try:
            async with asyncio.timeout(self._timeout_s):
                answer = decode_answer(await self._udp(query), qid)
                if answer.truncated:
                    answer = decode_answer(await self._tcp(query), qid)
        except (TimeoutError, OSError, DnsFormatError) as exc:
            raise DnsUnavailable(f"{name} ({qtype.name}) from {self._server[0]}: {exc or 'no answer'}") from exc
        if answer.rcode not in (0, RCODE_NXDOMAIN):
            raise DnsUnavailable(f"{name} ({qtype.name}): the server answered rcode {answer.rcode}")
        return answer

    async def _udp(self, query: bytes) -> bytes:
        loop = asyncio.get_running_loop()
        reply: asyncio.Future[bytes] = loop.create_future()
        transport, _ = await loop.create_datagram_endpoint(lambda: _Udp(reply), remote_addr=self._server)
        try:
            transport.sendto(query)
            data = await reply
        finally:
            transport.close()
        return data

    async def _tcp(self, query: bytes) -> bytes:
        reader, writer = await asyncio.open_connection(*self._server)
        try:
            writer.write(struct.pack("!H", len(query)) + query)
            await writer.drain()
            (length,) = struct.unpack("!H", await reader.readexactly(2))
            return await reader.readexactly(min(length, MAX_TCP_BYTES))
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


def _url(address: str, port: int) -> str:
    host = f"[{address}]" if ipaddress.ip_address(address).version == 6 else address
    return f"grpc://{host}:{port}"


async def resolve(client: DnsClient, target: DnsTarget, limit: int) -> set[str]:
    """The worker URLs ``target`` names now (at most ``limit``). Raises DnsUnavailable."""
    urls: set[str] = set()
    if target.port is not None:
        for qtype in (QType.A, QType.AAAA):
            answer = await client.query(target.name, qtype)
            for found in answer.addresses.values():
                urls.update(_url(a, target.port) for a in found)
    else:
        answer = await client.query(target.name, QType.SRV)
        for srv in sorted(answer.srv, key=lambda s: (s.priority, -s.weight, s.target)):
            known = answer.addresses.get(srv.target)
            if known is None:  # not in the additional section: ask
                known = (await client.query(srv.target, QType.A)).addresses.get(srv.target, ())
            urls.update(_url(a, srv.port) for a in known)
    return set(sorted(urls)[:limit])


class DnsDiscovery:
    """Keeps the registry's DNS-found workers equal to what the targets resolve to."""

    def __init__(
        self,
        targets: Sequence[DnsTarget],
        registry: WorkerRegistry,
        client: DnsClient,
        *,
        interval_s: float,
        max_workers: int,
    ) -> None:
        self._targets = tuple(targets)
        self._registry = registry
        self._client = client
        self._interval_s = interval_s
        self._max_workers = max_workers

    def _apply(self, target: DnsTarget, urls: set[str]) -> None:
        sync_owned(self._registry, f"dns:{target}", {url: WorkerSpec(url=url) for url in urls}, f"found by {target}")

    async def sync_once(self) -> None:
        for target in self._targets:
            try:
                urls = await resolve(self._client, target, self._max_workers)
            except DnsUnavailable as exc:
                log.warning("worker DNS %s: %s; keeping its workers as they are", target, exc)
                continue
            self._apply(target, urls)

    async def run(self) -> None:
        """Every interval, after the first (``sync_once`` is awaited at start)."""
        while True:
            await asyncio.sleep(self._interval_s)
            await self.sync_once()
