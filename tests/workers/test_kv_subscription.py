"""A worker's KV-event subscription as the node sees it, against the simulated engine's real gRPC server: the
stream shows as open before any cache event exists, and a worker without KV events is told apart at once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from node.cluster.registry import WorkerSpec
from node.errors import KvEventsUnsupported
from node.routing.kv_indexes import KvIndexes
from node.sim import SimModel, SimWorker, SimWorkerConfig, load_sim_model
from node.workers.breaker import CircuitBreaker
from node.workers.kv_subscriber import follow_kv_events
from node.workers.vllm_grpc import VllmGrpcClient
from node.workers.worker import Worker


@pytest.fixture(scope="module")
def sim_model(llama3_model_dir: Path) -> SimModel:
    return load_sim_model(SimWorkerConfig(model_path=str(llama3_model_dir)))


@pytest.fixture
async def engine(llama3_model_dir: Path, sim_model: SimModel, request: pytest.FixtureRequest) -> AsyncIterator[str]:
    config = SimWorkerConfig(model_path=str(llama3_model_dir), port=0, kv_events=request.param)
    async with SimWorker(config, sim_model) as worker:
        yield f"grpc://{worker.address}"


@pytest.mark.parametrize("engine", [True], indirect=True)
async def test_an_open_subscription_says_so_before_any_cache_event(engine: str) -> None:
    client = VllmGrpcClient(engine)
    try:
        stream = client.kv_events(0)
        # Nothing was generated, so the engine has no cache event to send: only the open stream is news.
        assert await asyncio.wait_for(anext(stream), 2) == (None, None)
        await stream.aclose()
    finally:
        await client.close()


@pytest.mark.parametrize("engine", [False], indirect=True)
async def test_a_worker_without_kv_events_is_unsupported_and_never_shown_as_streaming(engine: str) -> None:
    client = VllmGrpcClient(engine)
    try:
        with pytest.raises(KvEventsUnsupported):
            async for item in client.kv_events(0):
                raise AssertionError(f"a refused subscription yielded {item}")
        worker = Worker(
            WorkerSpec(url=engine), client, breaker=CircuitBreaker(failures_to_open=5, open_s=1.0, clock=time.monotonic)
        )
        seen: list[str] = []

        async def watch() -> None:
            while True:
                seen.append(worker.kv_events)
                await asyncio.sleep(0.001)

        watcher = asyncio.create_task(watch())
        await asyncio.wait_for(follow_kv_events(worker, KvIndexes(1024), model_of=None, recheck_s=0.1), 2)
        watcher.cancel()
        assert worker.kv_events == "unsupported" and "streaming" not in seen
    finally:
        await client.close()
