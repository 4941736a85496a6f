"""A worker that keeps its connections open but never answers (SIGSTOPped) leaves rotation within about two
health intervals, even with a health timeout far longer than the interval: a check waits at most one interval.
An idle one (checked every ``health_idle_every`` intervals) within that many intervals more."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from node.config import WorkerPoolConfig
from node.routing.round_robin import RoundRobin
from node.tasks import Supervisor
from node.workers.breaker import CircuitBreaker
from node.workers.pool import WorkerPool
from node.workers.vllm_grpc import VllmGrpcClient
from tests.procs import free_port, port_open, process, wait_until

INTERVAL_S = 0.3
TIMEOUT_S = 10.0  # the configured health timeout: far past the interval
SLACK_S = 0.4  # scheduling and the gRPC call's own overhead on a loaded test machine


async def _until(check: Callable[[], bool], timeout_s: float) -> float:
    """Seconds until ``check()`` holds (bounded)."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while not check():
        assert loop.time() - start < timeout_s, "timed out"
        await asyncio.sleep(0.01)
    return loop.time() - start


def _started_pool(config: WorkerPoolConfig, supervisor: Supervisor) -> WorkerPool:
    loop = asyncio.get_running_loop()
    pool = WorkerPool(
        config,
        client_factory=VllmGrpcClient,
        policies=lambda _role, _model: RoundRobin(),
        policy_name="round_robin",
        breakers=lambda: CircuitBreaker(failures_to_open=1, open_s=60.0, clock=loop.time),
        supervisor=supervisor,
    )
    pool.start()
    return pool


@pytest.mark.parametrize("idle_every", [1, 4])
async def test_a_hung_worker_is_out_within_two_intervals_and_a_bit(
    llama3_model_dir: Path, tmp_path: Path, idle_every: int
) -> None:
    port = free_port()
    args = [sys.executable, "-m", "node.sim", "--model-path", str(llama3_model_dir), "--port", str(port)]
    with process(args, log=tmp_path / "sim.log") as sim:
        wait_until(lambda: port_open(port), timeout_s=30, what="the simulated worker")
        config = WorkerPoolConfig(
            workers=(f"grpc://127.0.0.1:{port}",),
            health_interval_s=INTERVAL_S,
            health_timeout_s=TIMEOUT_S,
            health_idle_every=idle_every,
        )
        async with Supervisor() as supervisor:
            pool = _started_pool(config, supervisor)
            try:
                (worker,) = pool.workers
                await _until(lambda: pool.routable(worker), timeout_s=10)
                await asyncio.sleep(idle_every * INTERVAL_S / 2)  # between two checks
                os.kill(sim.pid, signal.SIGSTOP)
                try:
                    took = await _until(lambda: not pool.routable(worker), timeout_s=3 * TIMEOUT_S)
                finally:
                    os.kill(sim.pid, signal.SIGCONT)
                # Failures needed (2) x interval, plus the last check's wait for an answer (capped at one interval);
                # an idle worker's first failed check comes up to idle_every - 1 intervals later.
                bound = (config.health_failures_to_unhealthy + idle_every) * INTERVAL_S + SLACK_S
                assert took < bound, took
                assert "no answer to the health check" in worker.last_error
                await _until(lambda: pool.routable(worker), timeout_s=10)  # it answers again: back in rotation
            finally:
                await pool.close()


async def test_an_idle_worker_that_exits_is_out_within_two_intervals_not_its_idle_wait(
    llama3_model_dir: Path, tmp_path: Path
) -> None:
    """Its connection closes at once (kill -9: the kernel closes the sockets): that brings the next check
    forward, so the long wait of an idle worker (here 20 intervals) does not delay it."""
    idle_every = 20
    port = free_port()
    args = [sys.executable, "-m", "node.sim", "--model-path", str(llama3_model_dir), "--port", str(port)]
    with process(args, log=tmp_path / "sim.log") as sim:
        wait_until(lambda: port_open(port), timeout_s=30, what="the simulated worker")
        config = WorkerPoolConfig(
            workers=(f"grpc://127.0.0.1:{port}",), health_interval_s=INTERVAL_S, health_idle_every=idle_every
        )
        async with Supervisor() as supervisor:
            pool = _started_pool(config, supervisor)
            try:
                (worker,) = pool.workers
                await _until(lambda: pool.routable(worker), timeout_s=10)
                await asyncio.sleep(3 * INTERVAL_S)  # idle now: the next check is up to 20 intervals away
                os.kill(sim.pid, signal.SIGKILL)
                took = await _until(lambda: not pool.routable(worker), timeout_s=idle_every * INTERVAL_S)
                assert took < (config.health_failures_to_unhealthy + 1) * INTERVAL_S + SLACK_S, took
            finally:
                await pool.close()
