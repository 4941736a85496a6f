"""A worker that passes its health checks while its requests fail: its circuit opens and keeps it out of
rotation (no request reaches it, GET /workers and /metrics say so) until the cool-down ends and a trial
request succeeds."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import Any

import aiohttp

from node.app import RunningNode, run_node
from node.routing.config import RoutingConfig
from node.sim.worker import SimWorker
from node.workers.client import WorkerClient, WorkerUnavailable
from node.workers.types import WorkerOutput, WorkerRequest
from node.workers.vllm_grpc import VllmGrpcClient
from tests.http.conftest import fast_sim, node_config

OPEN_S = 1.5


class BrokenEngine:
    """A worker client whose Generate fails while ``broken`` (its health checks go to the real worker)."""

    def __init__(self, inner: VllmGrpcClient) -> None:
        self._inner = inner
        self.broken = True
        self.attempts = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def generate_batches(self, request: WorkerRequest) -> AsyncGenerator[list[WorkerOutput], None]:
        self.attempts += 1
        if self.broken:
            raise WorkerUnavailable(f"worker {self._inner.url}: Generate failed: UNAVAILABLE: engine dead")
        async for batch in self._inner.generate_batches(request):
            yield batch


async def _eventually(check: Callable[[], bool], what: str, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def _get(node: RunningNode, path: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as s, s.get(node.url + path) as r:
        return r.status, await r.text()


async def _chat(node: RunningNode) -> None:
    body = {"model": node.model.name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    async with aiohttp.ClientSession() as s, s.post(node.url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200, await r.text()


async def test_a_failing_worker_is_kept_out_until_a_trial_succeeds(llama3_model_dir: Path) -> None:
    async with contextlib.AsyncExitStack() as stack:
        good_sim = await stack.enter_async_context(SimWorker(fast_sim(llama3_model_dir)))
        bad_sim = await stack.enter_async_context(SimWorker(fast_sim(llama3_model_dir)))
        bad_url = f"grpc://127.0.0.1:{bad_sim.port}"
        broken = BrokenEngine(VllmGrpcClient(bad_url))

        def clients(url: str) -> WorkerClient:
            return broken if url == bad_url else VllmGrpcClient(url)

        routing = RoutingConfig(circuit_failures_to_open=2, circuit_open_s=OPEN_S)
        config = node_config(llama3_model_dir, [good_sim.port, bad_sim.port], routing)
        node = await stack.enter_async_context(run_node(config, client_factory=clients))
        pool = node.pool
        bad = next(w for w in pool.workers if w.url == bad_url)
        await _eventually(lambda: all(pool.routable(w) for w in pool.workers), "both workers in rotation")

        # Every failed request is retried on the good worker (the client sees 200s); each failure also takes
        # the bad worker out until its next health check passes, and then it is tried again.
        for _ in range(50):
            if bad.breaker.state == "open":
                break
            await _chat(node)
            await asyncio.sleep(0.05)
        assert bad.breaker.state == "open"
        assert broken.attempts == 2

        # Open: health checks keep passing (every 0.2 s), yet no request reaches it.
        served = good_sim.engine.completed_requests
        for _ in range(8):
            await _chat(node)
            await asyncio.sleep(0.1)
        assert bad.healthy, "its health checks pass"
        assert broken.attempts == 2, "a request reached a worker whose circuit is open"
        assert good_sim.engine.completed_requests == served + 8
        _, listing = await _get(node, "/workers")
        listed = {w["url"]: w for w in json.loads(listing)["data"]}
        assert listed[bad_url]["circuit"] == "open" and not listed[bad_url]["routable_here"]
        status, metrics = await _get(node, "/metrics")
        assert status == 200
        assert f'smg_node_worker_circuit_state{{state="open",worker="{bad_url}"}} 1.0' in metrics
        assert f'smg_node_worker_circuit_opens_total{{worker="{bad_url}"}} 1.0' in metrics
        # Both failures count against the bad worker, though each request was answered by the good one.
        failed = [x for x in metrics.splitlines() if x.startswith("smg_node_worker_errors_total{") and bad_url in x]
        assert sum(float(x.rsplit(" ", 1)[1]) for x in failed) == 2.0, failed

        # The engine recovers; after the cool-down one trial request closes the circuit.
        broken.broken = False
        await _eventually(lambda: bad.breaker.state == "half_open", "the cool-down to end", timeout_s=OPEN_S + 1)
        for _ in range(4):
            await _chat(node)
        assert bad.breaker.state == "closed"
        assert broken.attempts >= 4, "round robin sends to it again"
        assert bad_sim.engine.completed_requests == broken.attempts - 2
