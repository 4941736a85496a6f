"""The real-engine tier: vLLM's CPU build behind a real smg-node (``pytest -m real_engine``).

Session scope: one engine (40-65 s to start, ~3.6 GiB) serves every test. ``SMG_SKIP_REAL_ENGINE=1`` skips
the tier; ``SMG_REAL_ENGINE_URL=grpc://127.0.0.1:PORT`` uses an engine already running (started with
``python -m tests.real_engine.launcher serve PORT``) instead of starting one.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
from openai import AsyncOpenAI

from node.app import RunningNode, run_node
from node.config import HttpConfig, LogConfig, ModelConfig, NodeConfig, WorkerPoolConfig
from node.routing.config import RoutingConfig
from node.workers.vllm_grpc import VllmGrpcClient
from tests.real_engine import launcher


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if os.environ.get("SMG_SKIP_REAL_ENGINE") == "1":
        skip = pytest.mark.skip(reason="SMG_SKIP_REAL_ENGINE=1")
        for item in items:
            if "real_engine" in item.keywords:
                item.add_marker(skip)


@dataclass(frozen=True)
class Engine:
    url: str
    model_dir: Path


@pytest.fixture(scope="session")
def real_engine() -> Iterator[Engine]:
    existing = os.environ.get("SMG_REAL_ENGINE_URL")
    if existing:
        yield Engine(existing, launcher.ensure_model(launcher.ensure_venv()))
        return
    with launcher.running_engine() as engine:
        yield Engine(engine.url, engine.model_dir)


@dataclass
class Front:
    node: RunningNode
    client: AsyncOpenAI
    engine: VllmGrpcClient  # straight to the engine: its loads, as the node's view is what is under test

    @property
    def model(self) -> str:
        return self.node.model.name


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def front(real_engine: Engine) -> AsyncIterator[Front]:
    """A real node (cache_aware, so it subscribes to the engine's KV events) in front of the engine."""
    config = NodeConfig(
        routing=RoutingConfig(policy="cache_aware"),
        http=HttpConfig(port=0),
        model=ModelConfig(model_path=str(real_engine.model_dir)),
        workers=WorkerPoolConfig(workers=(real_engine.url,), health_interval_s=0.5, startup_wait_s=30),
        log=LogConfig(),
    )
    async with run_node(config) as node:
        client = AsyncOpenAI(base_url=f"{node.url}/v1", api_key="unused", max_retries=0, timeout=120)
        engine = VllmGrpcClient(real_engine.url)
        try:
            yield Front(node, client, engine)
        finally:
            await client.close()
            await engine.close()
