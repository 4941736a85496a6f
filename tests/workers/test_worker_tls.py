"""grpcs:// workers: the simulated engine served over mutual TLS with a test CA, reached on both Generate
transports (and by a node, from its config); a wrong CA, a missing client certificate or plaintext fail."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from node.app import run_node
from node.config import GenerateTransport
from node.errors import WorkerFailed
from node.sim import SimModel, SimWorker, SimWorkerConfig, load_sim_model
from node.workers.channel_config import ChannelConfig, WorkerTls, WorkerTlsError
from node.workers.types import SamplingParams, WorkerRequest
from node.workers.vllm_grpc import VllmGrpcClient
from tests.http.conftest import node_config
from tests.mesh.tls_certs import CertAuthority, TlsFiles

SERVER_NAME = "worker.mesh.invalid"  # what the test CA's certificate for "worker" names
TRANSPORTS: tuple[GenerateTransport, ...] = ("h2", "grpc")


@pytest.fixture
def certs(tmp_path: Path) -> tuple[TlsFiles, TlsFiles, TlsFiles]:
    """(worker's, gateway's, a stranger's from another CA)."""
    ca = CertAuthority(tmp_path, "workers")
    return ca.issue("worker"), ca.issue("gateway"), CertAuthority(tmp_path, "other").issue("gateway")


@pytest.fixture(scope="module")
def sim_model(llama3_model_dir: Path) -> SimModel:
    return load_sim_model(SimWorkerConfig(model_path=str(llama3_model_dir)))


@pytest.fixture
async def tls_worker(
    llama3_model_dir: Path, sim_model: SimModel, certs: tuple[TlsFiles, TlsFiles, TlsFiles]
) -> AsyncIterator[SimWorker]:
    worker, _, _ = certs
    config = SimWorkerConfig(
        model_path=str(llama3_model_dir),
        port=0,
        ttft_base_ms=0,
        tpot_ms=0,
        tls_cert_file=str(worker.cert),
        tls_key_file=str(worker.key),
        tls_client_ca_file=str(worker.ca),
    )
    async with SimWorker(config, sim_model) as running:
        yield running


def _channel(files: TlsFiles | None, ca: Path) -> ChannelConfig:
    tls = WorkerTls.load(
        ca_file=str(ca),
        cert_file=str(files.cert) if files else "",
        key_file=str(files.key) if files else "",
        server_name=SERVER_NAME,
    )
    return ChannelConfig(tls=tls)


async def _generate(client: VllmGrpcClient) -> str | None:
    request = WorkerRequest("tls", list(range(1000, 1010)), SamplingParams(max_tokens=3, ignore_eos=True))
    return [out async for out in client.generate(request)][-1].finish_reason


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_grpcs_worker_serves_over_mutual_tls(
    tls_worker: SimWorker, certs: tuple[TlsFiles, TlsFiles, TlsFiles], transport: GenerateTransport
) -> None:
    _, gateway, _ = certs
    client = VllmGrpcClient(
        f"grpcs://127.0.0.1:{tls_worker.port}", generate_transport=transport, channel=_channel(gateway, gateway.ca)
    )
    try:
        assert await client.health(timeout_s=5)
        assert await _generate(client) == "length"
    finally:
        await client.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_wrong_ca_no_client_certificate_or_plaintext_fail_unavailable(
    tls_worker: SimWorker, certs: tuple[TlsFiles, TlsFiles, TlsFiles], transport: GenerateTransport
) -> None:
    _, gateway, stranger = certs
    port = tls_worker.port
    attempts = [
        VllmGrpcClient(
            f"grpcs://127.0.0.1:{port}", generate_transport=transport, channel=_channel(stranger, stranger.ca)
        ),
        VllmGrpcClient(f"grpcs://127.0.0.1:{port}", generate_transport=transport, channel=_channel(None, gateway.ca)),
        VllmGrpcClient(f"grpc://127.0.0.1:{port}", generate_transport=transport),
    ]
    for client in attempts:
        try:
            assert not await client.health(timeout_s=2)
            with pytest.raises(WorkerFailed, match="Generate failed: UNAVAILABLE"):
                await _generate(client)
        finally:
            await client.close()


def test_tls_files_are_checked_at_start_and_never_shown(certs: tuple[TlsFiles, TlsFiles, TlsFiles]) -> None:
    _, gateway, _ = certs
    tls = _channel(gateway, gateway.ca).tls
    assert "PRIVATE" not in repr(tls)
    assert "BEGIN" not in repr(ChannelConfig(tls=tls))
    with pytest.raises(WorkerTlsError, match="worker_tls_ca_file /nonexistent"):
        WorkerTls.load(ca_file="/nonexistent", cert_file="", key_file="", server_name="")
    with pytest.raises(WorkerTlsError, match="unusable"):
        WorkerTls.load(ca_file=str(gateway.key), cert_file="", key_file="", server_name="")


async def test_a_node_reaches_a_grpcs_worker_from_its_config(
    tls_worker: SimWorker, certs: tuple[TlsFiles, TlsFiles, TlsFiles], llama3_model_dir: Path
) -> None:
    _, gateway, _ = certs
    config = node_config(llama3_model_dir, [])
    workers = dataclasses.replace(
        config.workers,
        workers=(f"grpcs://127.0.0.1:{tls_worker.port}",),
        worker_tls_ca_file=str(gateway.ca),
        worker_tls_cert_file=str(gateway.cert),
        worker_tls_key_file=str(gateway.key),
        worker_tls_server_name=SERVER_NAME,
    )
    async with run_node(dataclasses.replace(config, workers=workers)) as node:
        body = {"model": node.model.name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        async with aiohttp.ClientSession() as s, s.post(node.url + "/v1/chat/completions", json=body) as r:
            assert r.status == 200, await r.text()
            assert (await r.json())["usage"]["completion_tokens"] == 4
