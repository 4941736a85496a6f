"""The pool connects only to registered workers inside this node's policy, at most max_workers of them: the
registry is cluster state, and another node (with looser settings, or a bug) may have written the rest."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from node.cluster.registry import WorkerSpec
from node.config import WorkerPoolConfig
from node.routing.round_robin import RoundRobin
from node.tasks import Supervisor
from node.workers.breaker import CircuitBreaker
from node.workers.pool import WorkerPool


def _pool(config: WorkerPoolConfig, made: list[str], supervisor: Supervisor) -> WorkerPool:
    loop = asyncio.get_running_loop()

    def client(url: str) -> Any:
        made.append(url)
        return type("C", (), {"url": url, "close": lambda self: asyncio.sleep(0)})()

    return WorkerPool(
        config,
        client_factory=client,
        policies=lambda _role, _model: RoundRobin(),
        policy_name="round_robin",
        breakers=lambda: CircuitBreaker(failures_to_open=1, open_s=1.0, clock=loop.time),
        supervisor=supervisor,
    )


async def test_peers_registrations_outside_the_policy_or_the_bound_are_not_connected_to(
    caplog: pytest.LogCaptureFixture,
) -> None:
    made: list[str] = []
    async with Supervisor() as supervisor:
        pool = _pool(WorkerPoolConfig(max_workers=2, worker_allowed_networks=("10.0.0.0/8",)), made, supervisor)
        specs = [WorkerSpec(url=u) for u in ("grpc://10.0.0.1:1", "grpc://192.168.0.1:1", "grpc://169.254.169.254:80")]
        pool.sync({s.id: s for s in specs})
        assert made == ["grpc://10.0.0.1:1"]
        assert caplog.text.count("not connecting to registered worker") == 2
        more = [WorkerSpec(url=f"grpc://10.0.0.{i}:1") for i in range(2, 6)]
        pool.sync({s.id: s for s in specs + more})
        assert len(pool.workers) == 2
        assert "grpc://10.0.0.1:1" in [w.url for w in pool.workers]  # the one it had stays
        with pytest.raises(ValueError, match=r"^url: .*the most this node allows"):
            pool.vet(WorkerSpec(url="grpc://10.0.0.9:1"), registered=2)
        with pytest.raises(ValueError, match=r"^url: .*outside the allowed worker networks"):
            pool.vet(WorkerSpec(url="grpc://192.168.0.2:1"), registered=0)
        pool.vet(WorkerSpec(url="grpc://10.0.0.1:1"), registered=2)  # updating a held one is fine
