"""A real node in front of real (simulated) gRPC workers, in this test module's event loop."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest_asyncio
from openai import AsyncOpenAI

from node.app import RunningNode, run_node
from node.config import HttpConfig, LogConfig, ModelConfig, NodeConfig, WorkerPoolConfig
from node.http.tenancy import ApiConfig
from node.routing.config import RoutingConfig
from node.sim.config import SimWorkerConfig
from node.sim.worker import SimWorker
from storage.config import StorageConfig


@dataclass
class Cluster:
    node: RunningNode
    sims: list[SimWorker]
    client: AsyncOpenAI

    @property
    def model(self) -> str:
        return self.node.model.name


def node_config(model_dir: Path, ports: list[int], routing: RoutingConfig | None = None, **http: object) -> NodeConfig:
    return NodeConfig(
        routing=routing or RoutingConfig(),
        http=HttpConfig(port=0, **http),  # type: ignore[arg-type]
        model=ModelConfig(model_path=str(model_dir)),
        workers=WorkerPoolConfig(
            workers=tuple(f"grpc://127.0.0.1:{p}" for p in ports), health_interval_s=0.2, startup_wait_s=5
        ),
        log=LogConfig(),
    )


def fast_sim(model_dir: Path, **kw: object) -> SimWorkerConfig:
    """A simulated worker with a small but non-zero latency, so streams really stream."""
    base: dict[str, object] = {
        "port": 0,
        "model_path": str(model_dir),
        "ttft_base_ms": 1.0,
        "ttft_per_uncached_token_ms": 0.0,
        "tpot_ms": 0.5,
        "tpot_per_running_ms": 0.0,
    }
    base.update(kw)
    return SimWorkerConfig(**base)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def start_cluster(
    model_dir: Path,
    workers: int = 2,
    routing: RoutingConfig | None = None,
    *,
    storage: StorageConfig | None = None,
    api: ApiConfig | None = None,
    http: HttpConfig | None = None,
    **sim: object,
) -> AsyncIterator[Cluster]:
    async with contextlib.AsyncExitStack() as stack:
        sims = [await stack.enter_async_context(SimWorker(fast_sim(model_dir, **sim))) for _ in range(workers)]
        config = node_config(model_dir, [s.port for s in sims], routing)
        config = replace(config, storage=storage or config.storage, api=api or config.api, http=http or config.http)
        node = await stack.enter_async_context(run_node(config))
        client = AsyncOpenAI(base_url=f"{node.url}/v1", api_key="unused", max_retries=0, timeout=30)
        stack.push_async_callback(client.close)
        yield Cluster(node=node, sims=sims, client=client)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster(llama3_model_dir: Path) -> AsyncIterator[Cluster]:
    async with start_cluster(llama3_model_dir) as c:
        yield c
