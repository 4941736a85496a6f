"""What a health check sends: a worker in rotation that answers GetLoads gets one RPC per interval (HealthCheck
only every HEALTH_RPC_EVERY checks), and still leaves rotation within its bound when its engine reports itself
unhealthy while its server answers, or when it stops answering. An idle worker is checked every few intervals,
and traffic or a busy engine bring back every interval."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence

import pytest

from node.config import WorkerPoolConfig
from node.errors import KvEventsUnsupported, WorkerFailed
from node.routing.kv_events import KvEventBatch
from node.routing.round_robin import RoundRobin
from node.tasks import Supervisor
from node.workers.breaker import CircuitBreaker
from node.workers.health_check import HEALTH_RPC_EVERY
from node.workers.kv_convert import EngineLoad
from node.workers.pool import Worker, WorkerPool
from node.workers.types import ModelInfo, WorkerOutput, WorkerRequest

URL = "grpc://127.0.0.1:1"
INTERVAL_S = 0.05
FAILURES = 2
LOAD = EngineLoad(running=1, waiting=0, waiting_uncached_tokens=0, token_usage=0.25, gen_throughput=0.0)
IDLE_LOAD = EngineLoad(running=0, waiting=0, waiting_uncached_tokens=0, token_usage=0.0, gen_throughput=0.0)
IDLE_EVERY = 4


class ScriptedWorker:
    """A worker whose engine verdict (HealthCheck), load answers (GetLoads) and reachability are set by the test;
    it counts the RPCs it gets."""

    def __init__(self, *, answers_loads: bool = True, load: EngineLoad = LOAD) -> None:
        self.engine_ok = True
        self.reachable = True
        self.answers_loads = answers_loads
        self.load = load
        self.calls: list[str] = []

    @property
    def url(self) -> str:
        return URL

    async def health(self, *, timeout_s: float) -> bool:
        self.calls.append("health")
        return self.reachable and self.engine_ok

    async def model_info(self, *, timeout_s: float) -> ModelInfo:
        self.calls.append("model_info")
        return ModelInfo(served_model_name="m", model_path="/m", max_context_length=1024, vocab_size=100)

    async def loads(self, *, timeout_s: float) -> EngineLoad | None:
        self.calls.append("loads")
        if not self.reachable:
            raise WorkerFailed(f"worker {URL}: GetLoads failed: UNAVAILABLE: connection refused")
        return self.load if self.answers_loads else None

    async def kv_events(
        self, start_sequence_number: int
    ) -> AsyncGenerator[tuple[KvEventBatch | None, EngineLoad | None], None]:
        if start_sequence_number >= 0:  # always: the branch only makes this an async generator for mypy
            raise KvEventsUnsupported(f"worker {URL} publishes no KV events")
        yield None, None

    def generate(self, request: WorkerRequest) -> AsyncGenerator[WorkerOutput, None]:
        raise NotImplementedError

    async def abort(self, request_ids: Sequence[str], *, timeout_s: float) -> None:
        return None

    async def connection_lost(self) -> None:
        await asyncio.Event().wait()  # the test says when the worker is gone

    async def close(self) -> None:
        return None


@pytest.fixture
async def supervisor() -> AsyncIterator[Supervisor]:
    async with Supervisor() as running:
        yield running


async def _pool(worker: ScriptedWorker, supervisor: Supervisor) -> tuple[WorkerPool, Worker]:
    loop = asyncio.get_running_loop()
    config = WorkerPoolConfig(
        workers=(URL,),
        health_interval_s=INTERVAL_S,
        health_failures_to_unhealthy=FAILURES,
        health_idle_every=IDLE_EVERY,
    )
    pool = WorkerPool(
        config,
        client_factory=lambda _url: worker,
        policies=lambda _role, _model: RoundRobin(),
        policy_name="round_robin",
        breakers=lambda: CircuitBreaker(failures_to_open=100, open_s=1.0, clock=loop.time),
        supervisor=supervisor,
    )
    pool.start()
    (w,) = pool.workers
    await _checks_until(lambda: pool.routable(w))
    return pool, w


async def _checks_until(condition: Callable[[], bool], *, most: int = 40) -> None:
    for _ in range(most):
        if condition():
            return
        await asyncio.sleep(INTERVAL_S / 4)
    raise AssertionError("the condition never held")


async def _wait_checks(worker: ScriptedWorker, loads_calls: int) -> None:
    start = worker.calls.count("loads")
    await _checks_until(lambda: worker.calls.count("loads") >= start + loads_calls, most=loads_calls * 20)


async def test_a_worker_in_rotation_gets_one_rpc_per_check_and_health_check_every_few(
    supervisor: Supervisor,
) -> None:
    worker = ScriptedWorker()
    pool, w = await _pool(worker, supervisor)
    worker.calls.clear()
    await _wait_checks(worker, 4 * HEALTH_RPC_EVERY)
    checks = worker.calls.count("loads")
    health = worker.calls.count("health")
    # GetLoads on every check; HealthCheck on one check in HEALTH_RPC_EVERY (give or take the edges).
    assert checks // HEALTH_RPC_EVERY - 1 <= health <= checks // HEALTH_RPC_EVERY + 1
    assert w.load is not None and w.load.token_usage == LOAD.token_usage
    assert pool.routable(w)


async def test_a_worker_without_get_loads_gets_health_check_on_every_check(supervisor: Supervisor) -> None:
    worker = ScriptedWorker(answers_loads=False)
    pool, w = await _pool(worker, supervisor)
    worker.calls.clear()
    await _wait_checks(worker, 10)
    assert abs(worker.calls.count("health") - worker.calls.count("loads")) <= 1
    assert pool.routable(w)


async def test_an_engine_that_reports_unhealthy_behind_a_live_server_leaves_within_its_bound(
    supervisor: Supervisor,
) -> None:
    worker = ScriptedWorker()
    pool, w = await _pool(worker, supervisor)
    await _wait_checks(worker, HEALTH_RPC_EVERY)
    worker.engine_ok = False
    start = worker.calls.count("loads")
    await _checks_until(lambda: not pool.routable(w), most=200)
    assert worker.calls.count("loads") - start <= HEALTH_RPC_EVERY - 1 + FAILURES + 1  # +1: a check in flight
    # It comes back after one passed check, which includes HealthCheck.
    worker.engine_ok = True
    await _checks_until(lambda: pool.routable(w), most=200)


async def test_a_worker_that_stops_answering_leaves_after_failures_to_unhealthy_checks(
    supervisor: Supervisor,
) -> None:
    worker = ScriptedWorker()
    pool, w = await _pool(worker, supervisor)
    await _wait_checks(worker, HEALTH_RPC_EVERY)
    worker.reachable = False
    start = len(worker.calls)
    await _checks_until(lambda: not pool.routable(w), most=200)
    failed_checks = worker.calls[start:].count("loads") + worker.calls[start:].count("health")
    assert failed_checks <= FAILURES + 1  # +1: a check in flight when it stopped


async def _checks_within(worker: ScriptedWorker, intervals: int) -> int:
    start = worker.calls.count("loads")
    await asyncio.sleep(intervals * INTERVAL_S)
    return worker.calls.count("loads") - start


async def test_an_idle_worker_is_checked_every_few_intervals_until_traffic_or_a_busy_engine(
    supervisor: Supervisor,
) -> None:
    worker = ScriptedWorker(load=IDLE_LOAD)
    pool, w = await _pool(worker, supervisor)
    window = 24  # intervals
    idle = await _checks_within(worker, window)
    assert 2 <= idle <= window // IDLE_EVERY + 2, idle  # still checked, but every IDLE_EVERY intervals

    async def traffic() -> None:  # a request routed to it from this node now and then
        while True:
            w.dispatched += 1
            await asyncio.sleep(INTERVAL_S / 2)

    sender = asyncio.create_task(traffic())
    try:
        await asyncio.sleep(IDLE_EVERY * INTERVAL_S)  # the idle wait under way ends first
        with_traffic = await _checks_within(worker, window)
    finally:
        sender.cancel()
    assert with_traffic > window // IDLE_EVERY + 2 and with_traffic >= window // 2, with_traffic

    worker.load = LOAD  # other nodes' requests keep its engine busy: every interval again
    await asyncio.sleep(IDLE_EVERY * INTERVAL_S)
    busy = await _checks_within(worker, window)
    assert busy > window // IDLE_EVERY + 2 and busy >= window // 2, busy
    assert pool.routable(w)


async def test_an_idle_worker_that_stops_answering_is_checked_every_interval_after_the_first_failure(
    supervisor: Supervisor,
) -> None:
    worker = ScriptedWorker(load=IDLE_LOAD)
    pool, w = await _pool(worker, supervisor)
    await _wait_checks(worker, 2)  # idle by now
    loop = asyncio.get_running_loop()
    stopped = loop.time()
    worker.reachable = False
    await _checks_until(lambda: not pool.routable(w), most=400)
    took = loop.time() - stopped
    # At most IDLE_EVERY intervals to the first failed check, then one interval per further failure.
    assert took < (IDLE_EVERY + FAILURES) * INTERVAL_S + 0.3, took
    worker.reachable = True
    await _checks_until(lambda: pool.routable(w), most=200)
