"""Worker health checks: one loop per worker, each check bounded, judged with this node's own lag in mind.

A check is HealthCheck, then (once) GetModelInfo, then GetLoads unless the KV-event stream carries loads; a
worker in rotation that answers GetLoads is checked with GetLoads alone, and with HealthCheck too only every
``HEALTH_RPC_EVERY`` checks (see there). A worker leaves rotation after ``health_failures_to_unhealthy``
failed checks in a row and returns after one passed check. An idle worker is checked every
``health_idle_every`` intervals (as Envoy's ``no_traffic_interval``): its requests, when they come, are
watched by their own deadlines and the circuit breaker, and a lost connection (a worker process that exits
closes it at once; ``WorkerPool`` watches it) brings the next check forward.

Lifeguard's local health awareness, for workers: a node whose event loop lags (a CPU-heavy request, GC, an
overloaded host) cannot time a worker's answers, so its checks' deadlines stretch by the lag it measures, and
failures while it lags count only after ``MAX_EXCUSED_CHECKS`` of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from node.cluster.health import HealthBoard
from node.config import WorkerPoolConfig
from node.errors import WorkerFailed
from node.workers.worker import Worker, set_load

log = logging.getLogger(__name__)

#: A health check's deadline stretches by the event-loop lag seen meanwhile, to at most this many times the
#: deadline (Lifeguard's awareness multiplier; memberlist uses 8 for probes, but a health check also gates
#: routing, so a dead worker must still leave within a few intervals).
MAX_LAG_STRETCH = 4
#: Lags below this are scheduling noise: they do not stretch a deadline.
LAG_NOISE_S = 0.005
#: A failed check while our loop lagged at least this much is not counted against the worker: a loop that
#: stalls this long (GC, a CPU-heavy request, an overloaded host) cannot time a worker's answers.
LAGGING_S = 0.25
#: At most this many failed checks between two passed ones are excused that way: a dead worker still leaves
#: rotation on a node that lags all the time, after (failures_to_unhealthy + this) checks.
MAX_EXCUSED_CHECKS = 3
#: An answered GetLoads proves the worker's server is up and its engine loop answers, so a worker in rotation
#: whose last check passed is checked with GetLoads alone (one RPC per worker per interval: the RPCs were
#: most of an idle node's CPU with 64 workers), and HealthCheck (the engine's own verdict: a vLLM engine
#: that died behind a live server) goes out too on every this-many-th check, and on every check after a
#: failure, while out of rotation and when GetLoads gives no load. Bounds, in checks (one per interval):
#: a worker that stops answering leaves after ``health_failures_to_unhealthy`` as before; one whose server
#: answers while its engine reports unhealthy after at most ``HEALTH_RPC_EVERY - 1`` more (an idle worker's
#: checks are ``health_idle_every`` intervals apart).
HEALTH_RPC_EVERY = 5


class HealthChecker:
    """Runs the checks of every worker of a pool and publishes their verdicts on the board (if any)."""

    def __init__(
        self,
        config: WorkerPoolConfig,
        *,
        board: HealthBoard | None,
        loop_lag: Callable[[float], float],
        on_model_info: Callable[[], None],
    ) -> None:
        """``loop_lag(within_s)``: this node's worst event-loop lag of the last ``within_s`` seconds;
        ``on_model_info()``: a worker reported its ModelInfo for the first time."""
        self._config = config
        self._board = board
        self._loop_lag = loop_lag
        self._on_model_info = on_model_info

    async def run(self, worker: Worker) -> None:
        """Check ``worker`` every interval, forever (cancel to stop)."""
        # Fixed rate: a check starts every interval whatever the last one took (at most one interval unless
        # this node lags, see _timed_probe), so a worker that stops answering fails
        # ``health_failures_to_unhealthy`` checks within that many intervals plus one, however long
        # --health-timeout-s is.
        # An idle worker (see _idle) waits ``health_idle_every`` intervals instead: most of an idle node's CPU
        # with many workers was their checks. Its bound grows by as many intervals; the first failed check
        # brings back every interval, so it still leaves ``health_failures_to_unhealthy - 1`` intervals later.
        loop = asyncio.get_running_loop()
        interval = self._config.health_interval_s
        next_at = loop.time()
        seen = worker.dispatched
        while True:
            worker.recheck.clear()
            await self._check(worker)
            idle = self._idle(worker, seen)
            seen = worker.dispatched
            step = interval * self._config.health_idle_every if idle else interval
            next_at = max(next_at + step, loop.time())  # after a stall, no burst of checks to catch up
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(next_at):
                    await worker.recheck.wait()
                next_at = loop.time()  # a sign it may be gone (its connection closed): check now

    @staticmethod
    def _idle(worker: Worker, dispatched_before: int) -> bool:
        """In rotation, its last check passed cleanly, no request from this node since the previous check (nor
        one still open), and its engine reports nothing running or waiting (other nodes' traffic shows there)."""
        load = worker.load
        return (
            worker.healthy
            and worker.consecutive_failures == 0
            and worker.excused_checks == 0
            and worker.in_flight == 0
            and worker.dispatched == dispatched_before
            and (load is None or (load.running == 0 and load.waiting == 0))
        )

    def publish(self, worker: Worker) -> None:
        """Share this node's current view of ``worker`` with the cluster (the board decides how soon)."""
        if self._board is None:
            return
        load = worker.load
        self._board.observe(
            worker.id,
            worker.healthy,
            running=load.running if load is not None else 0,
            waiting=load.waiting if load is not None else 0,
            token_usage=load.token_usage if load is not None else 0.0,
            error=worker.last_error,
        )

    async def _probe(self, worker: Worker, rpc_timeout_s: float) -> bool:
        """Health, then (once) the model info and the load; False with ``last_error`` set on a failure.
        GetLoads alone when it proves enough (``HEALTH_RPC_EVERY``)."""
        poll_loads = not (worker.kv_events == "streaming" and worker.stream_loads)  # streamed loads are fresher
        loads_only = (
            poll_loads
            and worker.answers_loads
            and worker.healthy
            and worker.consecutive_failures == 0
            and worker.excused_checks == 0
            and worker.checks_without_health < HEALTH_RPC_EVERY - 1
        )
        ok = True if loads_only else await worker.client.health(timeout_s=rpc_timeout_s)
        try:
            if ok and worker.info is None:
                worker.info = await worker.client.model_info(timeout_s=rpc_timeout_s)
                self._on_model_info()
            if ok and poll_loads:
                load = await worker.client.loads(timeout_s=rpc_timeout_s)
                worker.answers_loads = load is not None
                if load is not None:
                    set_load(worker, load)
                elif loads_only:  # no load after all: only HealthCheck can tell
                    loads_only = False
                    ok = await worker.client.health(timeout_s=rpc_timeout_s)
        except WorkerFailed as exc:
            ok = False
            worker.last_error = exc.message
        worker.checks_without_health = worker.checks_without_health + 1 if loads_only and ok else 0
        return ok

    async def _check(self, worker: Worker) -> None:
        ok, lag_s = await self._timed_probe(worker)
        if ok:
            if not worker.healthy:
                was = "back in rotation after an outage" if worker.checked else "in rotation"
                log.info("worker %s healthy: %s", worker.url, was)
            worker.healthy = True
            worker.checked = True
            worker.consecutive_failures = 0
            worker.excused_checks = 0
            worker.last_error = ""
            self.publish(worker)
            return
        worker.last_error = worker.last_error or "health check failed"
        if lag_s >= LAGGING_S and worker.excused_checks < MAX_EXCUSED_CHECKS:
            # Our loop lagged through the check: its failure may be our delay, not the worker's. Not counted,
            # but only so often between two passed checks: a dead worker still leaves rotation on a starved node.
            worker.excused_checks += 1
            log.info("health check of %s failed while this node lagged %.2f s: not counted", worker.url, lag_s)
            return
        worker.consecutive_failures += 1
        if worker.consecutive_failures >= self._config.health_failures_to_unhealthy:
            if worker.healthy:
                log.warning(
                    "worker %s unhealthy after %d failed checks: %s",
                    worker.url,
                    worker.consecutive_failures,
                    worker.last_error,
                )
            worker.healthy = False
            worker.checked = True
        self.publish(worker)

    async def _timed_probe(self, worker: Worker) -> tuple[bool, float]:
        """(passed, the worst loop lag seen during the check).

        One deadline for the whole check (health, model info, load), never past the next check's start: a
        worker that accepts connections but never answers (hung, SIGSTOPped) fails at that boundary. The
        deadline stretches by the lag our own loop shows meanwhile (its timer firing late, the lag monitor),
        at most ``MAX_LAG_STRETCH`` times (Lifeguard): the deadline measures the worker's answer time, not our
        scheduling delay, and an answer that arrived while we were stalled still counts. The RPCs' own
        deadlines are the stretched maximum, so they never cut the check shorter.
        """
        loop = asyncio.get_running_loop()
        budget = min(self._config.health_timeout_s, self._config.health_interval_s)
        probe = asyncio.ensure_future(self._probe(worker, budget * MAX_LAG_STRETCH))
        started = loop.time()
        deadline = started + budget
        stretch_left = budget * (MAX_LAG_STRETCH - 1)
        worst_lag = 0.0
        try:
            while True:
                await asyncio.wait((probe,), timeout=max(0.0, deadline - loop.time()))
                lag = max(self._loop_lag(loop.time() - started), loop.time() - deadline)
                worst_lag = max(worst_lag, lag)
                if probe.done():
                    return probe.result(), worst_lag
                extra = min(lag, stretch_left)
                if extra < LAG_NOISE_S:
                    worker.last_error = f"no answer to the health check within {budget:g} s"
                    return False, worst_lag
                stretch_left -= extra
                deadline = loop.time() + extra
        finally:
            if not probe.done():
                probe.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await probe
