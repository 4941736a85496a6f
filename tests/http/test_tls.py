"""HTTPS for clients: the official openai client over TLS with a test CA, mutual TLS, and a certificate
reloaded into the live listener (SIGHUP on a real process) without dropping open connections."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import socket
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2 as httpx  # the HTTP client the openai package is built on
import pytest
from openai import AsyncOpenAI

from node.app import RunningNode, run_node
from node.config import HttpConfig
from node.http.connections import HANDSHAKE_SLACK_S
from node.sim.worker import SimWorker
from tests.http.conftest import fast_sim, node_config
from tests.mesh.tls_certs import CertAuthority, TlsFiles
from tests.procs import SMG_NODE, free_port, process, wait_until


def _client_context(ca: Path, client: TlsFiles | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca))
    if client is not None:
        context.load_cert_chain(client.cert, client.key)
    return context


def _served_cert(port: int, ca: Path) -> bytes:
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        _client_context(ca).wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
        assert der is not None
        return der


def _der(path: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(path.read_text())


@contextlib.asynccontextmanager
async def _https_node(
    model_dir: Path, files: TlsFiles, client_ca: str = "", max_connections: int = 0, header_timeout_s: float = 20.0
) -> AsyncIterator[RunningNode]:
    async with contextlib.AsyncExitStack() as stack:
        sim = await stack.enter_async_context(SimWorker(fast_sim(model_dir)))
        base = node_config(model_dir, [sim.port])
        http = HttpConfig(
            port=0,
            tls_cert_file=str(files.cert),
            tls_key_file=str(files.key),
            tls_client_ca_file=client_ca,
            max_connections=max_connections,
            header_timeout_s=header_timeout_s,
        )
        yield await stack.enter_async_context(run_node(dataclasses.replace(base, http=http)))


async def test_openai_client_over_https_and_reload_keeps_open_streams(llama3_model_dir: Path, tmp_path: Path) -> None:
    ca = CertAuthority(tmp_path, "web")
    first = ca.issue("node", hosts=["127.0.0.1"])
    async with _https_node(llama3_model_dir, first) as node:
        assert node.url.startswith("https://") and node.tls is not None
        http = httpx.AsyncClient(verify=_client_context(first.ca))
        async with AsyncOpenAI(base_url=f"{node.url}/v1", api_key="x", http_client=http, max_retries=0) as client:
            model = node.model.name
            done = await client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
            assert done.choices[0].message.content is not None
            stream = await client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": "a long one"}],
                max_tokens=200,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"ignore_eos": True},
            )
            chunks = 0
            tokens = 0
            async for chunk in stream:
                chunks += 1
                if chunk.usage is not None:
                    tokens = chunk.usage.completion_tokens
                if chunks == 3:  # mid-stream: a new certificate is installed
                    renewed = ca.issue("node-renewed", hosts=["127.0.0.1"])
                    os.replace(renewed.cert, first.cert)
                    os.replace(renewed.key, first.key)
                    assert node.tls.reload()
            assert tokens == 200  # the open stream ran to its end
            # New handshakes get the new one (a blocking client: in a thread, the node serves on this loop).
            assert await asyncio.to_thread(_served_cert, node.port, first.ca) == _der(first.cert)
        # A broken pair is refused and the node keeps its certificate.
        first.key.write_text("not a key")
        assert not node.tls.reload()
        assert await asyncio.to_thread(_served_cert, node.port, first.ca) == _der(first.cert)


async def test_mutual_tls_refuses_a_client_without_a_certificate(llama3_model_dir: Path, tmp_path: Path) -> None:
    ca = CertAuthority(tmp_path, "mtls")
    files = ca.issue("node", hosts=["127.0.0.1"])
    client = ca.issue("client")
    async with _https_node(llama3_model_dir, files, client_ca=str(files.ca)) as node:
        async with httpx.AsyncClient(verify=_client_context(files.ca, client)) as ok:
            assert (await ok.get(node.url + "/health")).status_code == 200
        async with httpx.AsyncClient(verify=_client_context(files.ca)) as anonymous:
            with pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)):
                await anonymous.get(node.url + "/health")


async def test_failed_handshakes_give_their_connection_count_back(llama3_model_dir: Path, tmp_path: Path) -> None:
    """A connection counts against --max-connections from its accept; one whose handshake fails never
    reaches the HTTP layer, and must not keep its place (at the cap every later client would get a 503):
    it is given back once the handshake deadline (header_timeout_s) has passed."""
    files = CertAuthority(tmp_path, "leak").issue("node", hosts=["127.0.0.1"])
    async with _https_node(llama3_model_dir, files, max_connections=3, header_timeout_s=1.0) as node:
        for _ in range(10):
            reader, writer = await asyncio.open_connection("127.0.0.1", node.port)
            writer.write(b"GET /health HTTP/1.1\r\nHost: node\r\n\r\n")  # not TLS: the handshake fails
            with contextlib.suppress(ConnectionError):
                await asyncio.wait_for(reader.read(), 10.0)
            writer.close()
        await asyncio.sleep(1.0 + HANDSHAKE_SLACK_S)
        async with httpx.AsyncClient(verify=_client_context(files.ca), limits=httpx.Limits(max_connections=3)) as ok:
            statuses = await asyncio.gather(*(ok.get(node.url + "/health") for _ in range(3)))
        assert [r.status_code for r in statuses] == [200, 200, 200]


def test_sighup_reloads_the_certificate_of_a_serving_process(llama3_model_dir: Path, tmp_path: Path) -> None:
    ca = CertAuthority(tmp_path, "hup")
    files = ca.issue("node", hosts=["127.0.0.1"])
    port = free_port()
    args = [*SMG_NODE, "serve", "--processes", "1", "--port", str(port), "--model-path", str(llama3_model_dir)]
    args += ["--tls-cert-file", str(files.cert), "--tls-key-file", str(files.key)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SMG_NODE_")}
    with process(args, log=tmp_path / "node.log", env=env) as proc:

        def serving() -> bool:
            try:
                return _served_cert(port, files.ca) == _der(files.cert)
            except OSError:
                return False

        wait_until(serving, timeout_s=60, what="the node to serve HTTPS")
        renewed = ca.issue("renewed", hosts=["127.0.0.1"])
        os.replace(renewed.cert, files.cert)
        os.replace(renewed.key, files.key)
        os.kill(proc.pid, signal.SIGHUP)
        wait_until(serving, timeout_s=10, what="the renewed certificate")
        assert proc.poll() is None
