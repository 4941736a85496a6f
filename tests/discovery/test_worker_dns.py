"""Workers by DNS against a real local DNS server (a small UDP+TCP responder run here): SRV and A targets
registered, changes followed, vanished workers removed, a DNS outage changing nothing, truncated answers
asked again over TCP; and the answer decoder against arbitrary bytes."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st

from node.app import run_node
from node.discovery.config import DiscoveryConfig, DnsTarget
from node.discovery.dns import DnsClient, resolve
from node.discovery.dns_wire import DnsFormatError, decode_answer
from node.sim.worker import SimWorker
from tests.http.conftest import fast_sim, node_config


def _name(name: str) -> bytes:
    return b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"


def _a(owner: bytes, ip: str) -> bytes:
    return owner + struct.pack("!HHIH", 1, 1, 5, 4) + bytes(map(int, ip.split(".")))


@dataclasses.dataclass
class Zone:
    """name -> A addresses; name -> SRV (port, target) records. Mutable while the server runs."""

    a: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    srv: dict[str, list[tuple[int, str]]] = dataclasses.field(default_factory=dict)
    truncate_udp: bool = False
    queries: list[tuple[str, int, str]] = dataclasses.field(default_factory=list)

    def answer(self, query: bytes, transport: str) -> bytes:
        qid = struct.unpack_from("!H", query)[0]
        offset, labels = 12, []
        while query[offset]:
            labels.append(query[offset + 1 : offset + 1 + query[offset]].decode())
            offset += 1 + query[offset]
        qtype = struct.unpack_from("!H", query, offset + 1)[0]
        question = query[12 : offset + 5]
        name = ".".join(labels).lower()
        self.queries.append((name, qtype, transport))
        answers, additional = [], []
        if qtype == 1:
            answers.extend(_a(b"\xc0\x0c", ip) for ip in self.a.get(name, []))
        elif qtype == 33:
            for port, target in self.srv.get(name, []):
                rdata = struct.pack("!HHH", 10, 5, port) + _name(target)
                answers.append(b"\xc0\x0c" + struct.pack("!HHIH", 33, 1, 5, len(rdata)) + rdata)
                additional.extend(_a(_name(target), ip) for ip in self.a.get(target, []))
        known = name in self.a or name in self.srv
        flags = 0x8180 | (0 if known else 3)
        if transport == "udp" and self.truncate_udp:
            return struct.pack("!HHHHHH", qid, flags | 0x0200, 1, 0, 0, 0) + question
        header = struct.pack("!HHHHHH", qid, flags, 1, len(answers), 0, len(additional))
        return header + question + b"".join(answers) + b"".join(additional)


class _Udp(asyncio.DatagramProtocol):
    def __init__(self, zone: Zone) -> None:
        self.zone = zone

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.transport.sendto(self.zone.answer(data, "udp"), addr)


@contextlib.asynccontextmanager
async def dns_server(zone: Zone) -> AsyncIterator[str]:
    loop = asyncio.get_running_loop()

    async def tcp(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        (length,) = struct.unpack("!H", await reader.readexactly(2))
        reply = zone.answer(await reader.readexactly(length), "tcp")
        writer.write(struct.pack("!H", len(reply)) + reply)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(tcp, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    udp, _ = await loop.create_datagram_endpoint(lambda: _Udp(zone), local_addr=("127.0.0.1", port))
    try:
        yield f"127.0.0.1:{port}"
    finally:
        udp.close()
        server.close()
        await server.wait_closed()


async def _workers(url: str) -> dict[str, dict[str, Any]]:
    async with aiohttp.ClientSession() as s, s.get(url + "/workers") as r:
        return {w["url"]: w for w in (await r.json())["data"]}


async def _until(check: Any, timeout_s: float = 10.0, what: str = "") -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, f"timed out: {what}"
        await asyncio.sleep(0.05)


async def test_srv_workers_follow_the_zone(llama3_model_dir: Path) -> None:
    zone = Zone()
    async with (
        SimWorker(fast_sim(llama3_model_dir)) as w1,
        SimWorker(fast_sim(llama3_model_dir)) as w2,
        dns_server(zone) as server,
    ):
        zone.a = {"w1.test": ["127.0.0.1"], "w2.test": ["127.0.0.1"]}
        zone.srv = {"workers.test": [(w1.port, "w1.test")]}
        discovery = DiscoveryConfig(worker_dns=("workers.test",), worker_dns_server=server, worker_dns_interval_s=0.1)
        config = dataclasses.replace(node_config(llama3_model_dir, []), discovery=discovery)
        url1, url2 = f"grpc://127.0.0.1:{w1.port}", f"grpc://127.0.0.1:{w2.port}"
        async with run_node(config) as node:
            # The first answer is in before the node serves: its worker named the model.
            assert node.model.name == "llama3"
            listed = await _workers(node.url)
            assert set(listed) == {url1} and listed[url1]["labels"] == {"smg.discovery": "dns:workers.test"}
            async with aiohttp.ClientSession() as s:
                body = {"model": "llama3", "prompt": "Hi", "max_tokens": 2}
                await _until(lambda: _ready(s, node.url), what="ready")
                async with s.post(node.url + "/v1/completions", json=body) as r:
                    assert r.status == 200

            zone.srv["workers.test"].append((w2.port, "w2.test"))
            await _until(lambda: _has(node.url, {url1, url2}), what="the second worker added")
            zone.srv["workers.test"] = [(w2.port, "w2.test")]
            await _until(lambda: _has(node.url, {url2}), what="the first worker removed")

            zone.queries.clear()
            zone.srv.clear()
            zone.a.clear()  # NXDOMAIN: the name names no worker any more
            await _until(lambda: _has(node.url, set()), what="every DNS worker removed")


async def test_a_records_dns_outage_and_tcp_fallback(llama3_model_dir: Path) -> None:
    zone = Zone(a={"pool.test": ["127.0.0.1"]})
    async with SimWorker(fast_sim(llama3_model_dir)) as w, contextlib.AsyncExitStack() as stack:
        server = await stack.enter_async_context(dns_server(zone))
        discovery = DiscoveryConfig(
            worker_dns=(f"pool.test:{w.port}",), worker_dns_server=server, worker_dns_interval_s=0.1,
            worker_dns_timeout_s=0.3,
        )  # fmt: skip
        config = dataclasses.replace(node_config(llama3_model_dir, []), discovery=discovery)
        async with run_node(config) as node:
            url = f"grpc://127.0.0.1:{w.port}"
            assert set(await _workers(node.url)) == {url}
            await stack.aclose()  # the DNS server goes away: an outage changes nothing
            await asyncio.sleep(1.0)
            assert set(await _workers(node.url)) == {url}

    zone.truncate_udp = True
    async with dns_server(zone) as server:
        host, port = server.split(":")
        client = DnsClient((host, int(port)), timeout_s=2)
        assert await resolve(client, DnsTarget.parse("pool.test:50051"), 10) == {"grpc://127.0.0.1:50051"}
        assert ("pool.test", 1, "tcp") in zone.queries, "a truncated UDP answer is asked again over TCP"


async def _ready(s: aiohttp.ClientSession, url: str) -> bool:
    async with s.get(url + "/readiness") as r:
        return r.status == 200


async def _has(url: str, expected: set[str]) -> bool:
    return set(await _workers(url)) == expected


def test_config_refuses_bad_targets() -> None:
    with pytest.raises(ValueError, match="port"):
        DiscoveryConfig(worker_dns=("workers.test:99999",))
    with pytest.raises(ValueError, match="HOST:PORT"):
        DiscoveryConfig(worker_dns=("a.test",), worker_dns_server="nope")
    assert DnsTarget.parse("Workers.Test.:50051") == DnsTarget("workers.test", 50051)


@given(st.binary(max_size=600))
def test_decoder_refuses_garbage_cleanly(data: bytes) -> None:
    qid = int.from_bytes(data[:2], "big") if len(data) >= 2 else 0
    try:
        decode_answer(data, qid)
    except DnsFormatError:
        pass


def test_compression_loop_is_refused() -> None:
    header = struct.pack("!HHHHHH", 7, 0x8180, 0, 1, 0, 0)
    looping = header + b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 5, 4) + b"\x7f\0\0\1"
    with pytest.raises(DnsFormatError, match="loop"):
        decode_answer(looping, 7)
