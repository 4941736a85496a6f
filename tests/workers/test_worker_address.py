"""Workers addressed by name: every address the name resolves to is held to the worker network policy, at
registration (the admin API's 400 names the address) and before each connection, so a name that rebinds to a
forbidden address takes the worker out instead of sending requests there. Names resolve through the system
resolver (``localhost``) or a real local DNS server (the one the DNS discovery tests run)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from node.app import run_node
from node.config import GenerateTransport
from node.discovery.dns import DnsClient, DnsUnavailable
from node.discovery.dns_wire import QType
from node.sim.worker import SimWorker
from node.workers.channel_config import ChannelConfig, WorkerTls
from node.workers.client import WorkerUnavailable
from node.workers.types import SamplingParams, WorkerRequest
from node.workers.vllm_grpc import VllmGrpcClient
from node.workers.worker_address import (
    WorkerAddressError,
    WorkerUnresolved,
    checked_addresses,
    system_resolve,
)
from node.workers.worker_url import IpAddress, NetworkPolicy, parse_networks, parse_target
from tests.discovery.test_worker_dns import Zone, dns_server
from tests.http.conftest import fast_sim, node_config
from tests.mesh.tls_certs import CertAuthority

TRANSPORTS: tuple[GenerateTransport, ...] = ("h2", "grpc")
LOOPBACK = NetworkPolicy(allowed=parse_networks(("127.0.0.0/8",), "test"))


def _policy(*cidrs: str) -> NetworkPolicy:
    return NetworkPolicy(allowed=parse_networks(cidrs, "test"))


async def test_a_name_is_checked_by_every_address_it_resolves_to() -> None:
    target = parse_target("grpc://localhost:5")
    pinned = await checked_addresses("grpc://localhost:5", target, NetworkPolicy())
    assert pinned.addresses == (ipaddress.ip_address("127.0.0.1"),)
    assert pinned.grpc_target() == "ipv4:127.0.0.1:5"
    with pytest.raises(WorkerAddressError, match=r"resolves to 127\.0\.0\.1, outside the allowed worker networks"):
        await checked_addresses("grpc://localhost:5", target, _policy("10.0.0.0/8"))

    async def two(host: str) -> list[IpAddress]:  # one allowed address does not excuse the other
        return [ipaddress.ip_address("10.0.0.7"), ipaddress.ip_address("169.254.169.254")]

    with pytest.raises(WorkerAddressError, match=r"169\.254\.169\.254, in a link-local or metadata range"):
        await checked_addresses("grpc://w:5", parse_target("grpc://w:5"), NetworkPolicy(), resolve=two)
    with pytest.raises(WorkerUnresolved, match="does not resolve"):
        await checked_addresses("grpc://no-such-worker.invalid:5", parse_target("grpc://x.invalid:5"), LOOPBACK)


async def test_a_resolver_that_never_answers_times_out_without_stalling_the_loop() -> None:
    async def never(host: str) -> list[IpAddress]:
        await asyncio.sleep(3600)
        return []

    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    ticker = asyncio.create_task(tick())
    started = time.monotonic()
    with pytest.raises(WorkerUnresolved, match=r"did not resolve within 0\.3 s"):
        await checked_addresses("grpc://w:5", parse_target("grpc://w:5"), NetworkPolicy(), resolve=never, timeout_s=0.3)
    ticker.cancel()
    assert time.monotonic() - started < 1.0
    assert ticks >= 10
    assert (await system_resolve("localhost"))[0] == ipaddress.ip_address("127.0.0.1")


def _dns_resolver(server: str) -> Any:
    host, _, port = server.rpartition(":")
    client = DnsClient((host, int(port)), timeout_s=2.0)

    async def resolve(name: str) -> list[IpAddress]:
        try:
            answer = await client.query(name, QType.A)
        except DnsUnavailable as exc:
            raise OSError(str(exc)) from None
        found = answer.addresses.get(name, ())
        if not found:
            raise OSError(f"{name}: no such name")
        return [ipaddress.ip_address(a) for a in found]

    return resolve


@contextlib.asynccontextmanager
async def _named(zone: Zone, name: str, port: int, transport: GenerateTransport, **kw: Any) -> AsyncIterator[Any]:
    async with dns_server(zone) as server:
        client = VllmGrpcClient(
            f"{kw.pop('scheme', 'grpc')}://{name}:{port}",
            generate_transport=transport,
            resolve=_dns_resolver(server),
            **kw,
        )
        try:
            yield client
        finally:
            await client.close()


async def _finish(client: VllmGrpcClient) -> str | None:
    request = WorkerRequest("named", list(range(1000, 1010)), SamplingParams(max_tokens=3, ignore_eos=True))
    return [out async for out in client.generate(request)][-1].finish_reason


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_name_rebound_to_a_forbidden_address_takes_the_worker_out(
    llama3_model_dir: Path, transport: GenerateTransport
) -> None:
    zone = Zone(a={"worker.test": ["127.0.0.1"]})
    async with (
        SimWorker(fast_sim(llama3_model_dir)) as sim,
        _named(zone, "worker.test", sim.port, transport, policy=LOOPBACK, refresh_s=0.0) as client,
    ):
        assert await _finish(client) == "length"
        assert await client.health(timeout_s=2.0)
        for forbidden, why in (("10.1.2.3", "outside the allowed"), ("169.254.169.254", "outside the allowed")):
            zone.a["worker.test"] = [forbidden]
            assert not await client.health(timeout_s=2.0)  # the health check resolves again: refused
            with pytest.raises(WorkerUnavailable, match=rf"resolves to {forbidden}, {why}"):
                await _finish(client)
            zone.a["worker.test"] = ["127.0.0.1", forbidden]  # one bad address refuses the name
            assert not await client.health(timeout_s=2.0)
        zone.a["worker.test"] = ["127.0.0.1"]
        assert await client.health(timeout_s=2.0)  # back where it is allowed
        assert await _finish(client) == "length"
        del zone.a["worker.test"]  # a DNS outage keeps the addresses checked before
        assert await client.health(timeout_s=2.0)
        assert await _finish(client) == "length"


async def test_the_default_policy_refuses_a_name_leading_to_the_metadata_service(llama3_model_dir: Path) -> None:
    zone = Zone(a={"worker.test": ["169.254.169.254"]})
    async with _named(zone, "worker.test", 80, "h2") as client:
        assert not await client.health(timeout_s=2.0)
        with pytest.raises(WorkerUnavailable, match=r"169\.254\.169\.254, in a link-local or metadata range"):
            await _finish(client)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_grpcs_worker_by_name_is_verified_against_the_name(
    llama3_model_dir: Path, tmp_path: Path, transport: GenerateTransport
) -> None:
    ca = CertAuthority(tmp_path, "workers")
    worker, gateway = ca.issue("worker"), ca.issue("gateway")  # the worker's certificate names worker.mesh.invalid
    sim_config = fast_sim(
        llama3_model_dir,
        tls_cert_file=str(worker.cert),
        tls_key_file=str(worker.key),
        tls_client_ca_file=str(worker.ca),
    )
    tls = WorkerTls.load(ca_file=str(worker.ca), cert_file=str(gateway.cert), key_file=str(gateway.key), server_name="")
    zone = Zone(a={"worker.mesh.invalid": ["127.0.0.1"], "other.mesh.invalid": ["127.0.0.1"]})
    async with SimWorker(sim_config) as sim:
        channel = ChannelConfig(tls=tls)
        async with _named(zone, "worker.mesh.invalid", sim.port, transport, scheme="grpcs", channel=channel) as ok:
            assert await _finish(ok) == "length"  # connected to 127.0.0.1, the certificate checked for the name
        async with _named(zone, "other.mesh.invalid", sim.port, transport, scheme="grpcs", channel=channel) as bad:
            with pytest.raises(Exception, match=r"(?i)certificate|handshake|UNAVAILABLE"):
                await _finish(bad)


async def _call(method: str, url: str, **kw: Any) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s, s.request(method, url, **kw) as r:
        return r.status, await r.json()


async def test_registration_resolves_the_name_and_names_the_refused_address(llama3_model_dir: Path) -> None:
    async with contextlib.AsyncExitStack() as stack:
        sim = await stack.enter_async_context(SimWorker(fast_sim(llama3_model_dir)))
        config = node_config(llama3_model_dir, [])
        workers = dataclasses.replace(config.workers, worker_allowed_networks=("10.0.0.0/8",))
        node = await stack.enter_async_context(run_node(dataclasses.replace(config, workers=workers)))
        for url, why in (
            ("grpc://localhost:5", "resolves to 127.0.0.1, outside the allowed worker networks (10.0.0.0/8)"),
            ("grpc://no-such-worker.invalid:5", "does not resolve"),
        ):
            status, err = await _call("POST", node.url + "/workers", json={"url": url})
            assert status == 400, (url, err)
            assert (err["error"]["type"], err["error"]["param"]) == ("invalid_request_error", "url")
            assert why in err["error"]["message"], err
        _, listing = await _call("GET", node.url + "/workers")
        assert listing["data"] == []

        # The default policy: localhost is allowed, registered by name and served through its checked address.
        open_node = await stack.enter_async_context(run_node(node_config(llama3_model_dir, [])))
        status, body = await _call("POST", open_node.url + "/workers", json={"url": f"grpc://localhost:{sim.port}"})
        assert status == 201, body
        chat = {"model": open_node.model.name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        deadline = time.monotonic() + 15
        while (answer := await _call("POST", open_node.url + "/v1/chat/completions", json=chat))[0] != 200:
            assert time.monotonic() < deadline, answer
            await asyncio.sleep(0.1)
