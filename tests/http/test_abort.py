"""The worker stops generating when nobody wants the tokens: a client that disconnects, or a stop string."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import msgspec
import pytest
import pytest_asyncio

from tests.http.conftest import Cluster, start_cluster

pytestmark = pytest.mark.asyncio(loop_scope="module")

ABORT_DEADLINE_S = 0.1  # the bound: Abort reaches the worker within 100 ms of the disconnect


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def slow_cluster(llama3_model_dir: Path) -> AsyncIterator[Cluster]:
    # 20 ms per token: a 2,000-token answer would take 40 s, so anything that ends sooner was aborted.
    async with start_cluster(llama3_model_dir, workers=1, tpot_ms=20.0) as c:
        yield c


async def _wait_aborted(cluster: Cluster, request_id: str, timeout_s: float = 5.0) -> float:
    """Seconds until the worker has seen an Abort for ``request_id`` (polled every ms)."""
    engine = cluster.sims[0].engine
    started = time.monotonic()
    while request_id not in engine.aborted_request_ids:
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"the worker never saw an Abort for {request_id}")
        await asyncio.sleep(0.001)
    return time.monotonic() - started


async def test_client_disconnect_aborts_the_worker_request(slow_cluster: Cluster) -> None:
    body = {
        "model": slow_cluster.model,
        "messages": [{"role": "user", "content": "a long story please"}],
        "max_tokens": 2000,
        "ignore_eos": True,
        "stream": True,
    }
    session = aiohttp.ClientSession()
    resp = await session.post(slow_cluster.node.url + "/v1/chat/completions", json=body)
    assert resp.status == 200
    request_id = ""
    deltas = 0
    async for line in resp.content:
        if line.startswith(b"data: {"):
            chunk = msgspec.json.decode(line[6:])
            request_id = chunk["id"]
            deltas += 1
            if deltas == 4:
                break
    assert request_id in slow_cluster.sims[0].engine.active_request_ids
    resp.connection.transport.abort()  # type: ignore[union-attr]  # the client vanishes, no goodbye
    elapsed = await _wait_aborted(slow_cluster, request_id)
    resp.close()
    await session.close()
    assert elapsed < ABORT_DEADLINE_S, f"Abort reached the worker after {elapsed * 1000:.1f} ms"
    await asyncio.sleep(0.05)
    assert request_id not in slow_cluster.sims[0].engine.active_request_ids


async def test_stop_string_aborts_the_rest_of_the_generation(slow_cluster: Cluster) -> None:
    probe = await slow_cluster.client.chat.completions.create(
        model=slow_cluster.model,
        messages=[{"role": "user", "content": "x"}],
        max_tokens=6,
        seed=1,
        extra_body={"ignore_eos": True},
    )
    text = probe.choices[0].message.content or ""
    stop = text.split(" ")[3]
    started = time.monotonic()
    r = await slow_cluster.client.chat.completions.create(
        model=slow_cluster.model,
        messages=[{"role": "user", "content": "x"}],
        max_tokens=2000,
        seed=1,
        stop=[stop],
        extra_body={"ignore_eos": True},
    )
    assert r.choices[0].finish_reason == "stop"
    assert time.monotonic() - started < 5, "the answer ended at the stop string, not after 2,000 tokens"
    await _wait_aborted(slow_cluster, r.id)


async def test_a_messages_client_disconnect_aborts_the_worker_request(slow_cluster: Cluster) -> None:
    """The Anthropic Messages stream too: its idle-ping task does not keep the generation alive."""
    body = {
        "model": slow_cluster.model,
        "messages": [{"role": "user", "content": "a long story please"}],
        "max_tokens": 2000,
        "stream": True,
    }
    async with aiohttp.ClientSession() as session:
        resp = await session.post(slow_cluster.node.url + "/v1/messages", json=body)
        assert resp.status == 200
        request_id = ""
        deltas = 0
        async for line in resp.content:
            if line.startswith(b"data: {"):
                event = msgspec.json.decode(line[6:])
                if event["type"] == "message_start":
                    request_id = event["message"]["id"]
                deltas += event["type"] == "content_block_delta"
                if deltas == 4:
                    break
        assert request_id.startswith("msg_") and request_id in slow_cluster.sims[0].engine.active_request_ids
        resp.connection.transport.abort()  # type: ignore[union-attr]
        elapsed = await _wait_aborted(slow_cluster, request_id)
        resp.close()
    assert elapsed < ABORT_DEADLINE_S, f"Abort reached the worker after {elapsed * 1000:.1f} ms"
