"""A starved gateway does not blame its workers: health checks that straddle an event-loop stall (time.sleep in
a callback, far past the check's deadline) leave a live worker in rotation, while a dead one still leaves
within a bounded number of checks. The live worker is a separate process, so only our loop stalls."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from node.config import WorkerPoolConfig
from node.loop_monitor import LoopLagMonitor
from node.routing.round_robin import RoundRobin
from node.tasks import Supervisor
from node.workers.breaker import CircuitBreaker
from node.workers.client import WorkerClient
from node.workers.health_check import MAX_EXCUSED_CHECKS
from node.workers.kv_convert import EngineLoad
from node.workers.pool import WorkerPool
from node.workers.vllm_grpc import VllmGrpcClient
from tests.procs import free_port, port_open, process, wait_until

INTERVAL_S = 0.2  # also the check's deadline (health_timeout_s is longer)
STALL_S = 0.6  # three deadlines: every check's answer arrives while the loop sleeps
FAILURES = 2
T = TypeVar("T")


class _StallingClient:
    """A real client whose health checks each stall the event loop just after the RPC went out."""

    def __init__(self, url: str, stalls: Callable[[], bool]) -> None:
        self._inner = VllmGrpcClient(url)
        self._stalls = stalls
        self._after_health = False  # the last RPC was HealthCheck: this check already stalled

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def health(self, *, timeout_s: float) -> bool:
        self._after_health = True
        return await self._stalled(self._inner.health(timeout_s=timeout_s), stall=True)

    async def loads(self, *, timeout_s: float) -> EngineLoad | None:
        # A check of a worker in rotation is often GetLoads alone (HEALTH_RPC_EVERY): it stalls there then.
        # One stall per check, as when every check started with HealthCheck.
        stall, self._after_health = not self._after_health, False
        return await self._stalled(self._inner.loads(timeout_s=timeout_s), stall=stall)

    async def _stalled(self, rpc: Awaitable[T], *, stall: bool) -> T:
        call = asyncio.ensure_future(rpc)
        if stall and self._stalls():
            # The whole loop, not just this check, once the request went out (written at the end of the
            # iteration that made it).
            loop = asyncio.get_running_loop()
            loop.call_soon(loop.call_soon, time.sleep, STALL_S)
        return await call


async def test_loop_stalls_do_not_take_a_live_worker_out_but_a_dead_one_still_goes(
    llama3_model_dir: Path, tmp_path: Path
) -> None:
    ports = [free_port(), free_port()]
    with contextlib.ExitStack() as procs:
        sims = [
            procs.enter_context(
                process(
                    [sys.executable, "-m", "node.sim", "--model-path", str(llama3_model_dir), "--port", str(port)],
                    log=tmp_path / f"sim-{port}.log",
                )
            )
            for port in ports
        ]
        for port in ports:
            wait_until(lambda port=port: port_open(port), timeout_s=30, what="a simulated worker")
        live_url, dead_url = (f"grpc://127.0.0.1:{port}" for port in ports)
        config = WorkerPoolConfig(
            workers=(live_url, dead_url),
            health_interval_s=INTERVAL_S,
            health_timeout_s=5.0,
            health_failures_to_unhealthy=FAILURES,
        )
        stalling = False
        monitor = LoopLagMonitor(interval_s=0.02)
        loop = asyncio.get_running_loop()

        def client(url: str) -> WorkerClient:
            return _StallingClient(url, lambda: stalling)

        async with Supervisor() as supervisor:
            supervisor.spawn(monitor.run(), name="loop-lag")
            pool = WorkerPool(
                config,
                client_factory=client,
                policies=lambda _role, _model: RoundRobin(),
                policy_name="round_robin",
                breakers=lambda: CircuitBreaker(failures_to_open=100, open_s=60.0, clock=loop.time),
                supervisor=supervisor,
                loop_lag=monitor.recent_lag_s,
            )
            live, dead = sorted(pool.workers, key=lambda w: w.url != live_url)
            pool.start()
            try:
                deadline = loop.time() + 15
                while not (pool.routable(live) and pool.routable(dead)):
                    assert loop.time() < deadline, "the workers never became healthy"
                    await asyncio.sleep(0.02)
                sims[1].kill()  # the second one dies (connections reset, then refused) as the stalls begin
                stalling = True
                started = loop.time()
                # Each round of checks stalls the loop once per worker; the dead one's failures are excused at
                # most MAX_EXCUSED_CHECKS times, then count.
                bound = (FAILURES + MAX_EXCUSED_CHECKS) * (INTERVAL_S + 2 * STALL_S) + 1.0
                dead_out_after = None
                live_dropped = False
                while loop.time() - started < (bound if dead_out_after is None else 4.0):
                    live_dropped = live_dropped or not pool.routable(live)
                    if dead_out_after is None and not pool.routable(dead):
                        dead_out_after = loop.time() - started
                    await asyncio.sleep(0.01)
                assert not live_dropped, live.last_error
                assert live.consecutive_failures == 0, (live.last_error, live.excused_checks)
                assert dead_out_after is not None, "a dead worker stayed in rotation"
            finally:
                stalling = False
                await pool.close()
