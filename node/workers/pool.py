"""The node's workers: one client each, health-checked in the background, chosen per request by a policy.

Invariants: a worker is in rotation only after a successful health check; it leaves rotation after
``health_failures_to_unhealthy`` failed checks in a row, or at once when a request to it fails to connect.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from node.config import WorkerPoolConfig
from node.errors import NoHealthyWorker, WorkerFailed
from node.routing.policy import RouteRequest, RoutingPolicy
from node.tasks import Supervisor
from node.workers.client import WorkerClient
from node.workers.types import ModelInfo

log = logging.getLogger(__name__)

ClientFactory = Callable[[str], WorkerClient]


@dataclass(slots=True, eq=False)
class Worker:
    client: WorkerClient
    healthy: bool = False
    consecutive_failures: int = 0
    in_flight: int = 0
    info: ModelInfo | None = None
    last_error: str = field(default="")

    @property
    def url(self) -> str:
        return self.client.url


class WorkerPool:
    def __init__(
        self,
        config: WorkerPoolConfig,
        *,
        client_factory: ClientFactory,
        policy: RoutingPolicy,
        supervisor: Supervisor,
    ) -> None:
        self._config = config
        self._policy = policy
        self._supervisor = supervisor
        self._workers = [Worker(client=client_factory(url)) for url in config.workers]
        self._model_info_ready = asyncio.Event()

    @property
    def workers(self) -> Sequence[Worker]:
        return self._workers

    def healthy(self) -> list[Worker]:
        return [w for w in self._workers if w.healthy]

    def start(self) -> None:
        self._supervisor.spawn(self._health_loop(), name="worker-health")

    async def close(self) -> None:
        await asyncio.gather(*(w.client.close() for w in self._workers), return_exceptions=True)

    def select(self, request: RouteRequest) -> Worker:
        """Pick a worker for ``request``; raises NoHealthyWorker (503) when none is in rotation."""
        candidates = self.healthy()
        if not candidates:
            raise NoHealthyWorker("no healthy worker is available to serve this request; try again later")
        return self._policy.select(candidates, request)

    def report_failure(self, worker: Worker, error: WorkerFailed) -> None:
        """A request could not reach ``worker``: take it out of rotation until a health check passes."""
        if worker.healthy:
            log.warning("worker %s out of rotation: %s", worker.url, error.message)
        worker.healthy = False
        worker.last_error = error.message

    def abort_soon(self, worker: Worker, request_id: str) -> None:
        """Send Abort for ``request_id`` without making the caller wait (the task is owned and awaited)."""
        self._supervisor.spawn(self._abort(worker, request_id), name=f"abort-{request_id}")

    async def _abort(self, worker: Worker, request_id: str) -> None:
        try:
            await worker.client.abort([request_id], timeout_s=self._config.abort_timeout_s)
        except WorkerFailed as exc:
            log.info("abort of %s on %s failed: %s", request_id, worker.url, exc.message)

    async def wait_model_info(self, timeout_s: float) -> ModelInfo | None:
        """The first ModelInfo any worker reports, or None if none answers within ``timeout_s``."""
        try:
            await asyncio.wait_for(self._model_info_ready.wait(), timeout_s)
        except TimeoutError:
            return None
        return next(w.info for w in self._workers if w.info is not None)

    async def _health_loop(self) -> None:
        while True:
            await asyncio.gather(*(self._check(w) for w in self._workers))
            await asyncio.sleep(self._config.health_interval_s)

    async def _check(self, worker: Worker) -> None:
        ok = await worker.client.health(timeout_s=self._config.health_timeout_s)
        if ok and worker.info is None:
            try:
                worker.info = await worker.client.model_info(timeout_s=self._config.health_timeout_s)
                self._model_info_ready.set()
            except WorkerFailed as exc:
                ok = False
                worker.last_error = exc.message
        if ok:
            if not worker.healthy:
                log.info("worker %s healthy", worker.url)
            worker.healthy = True
            worker.consecutive_failures = 0
            worker.last_error = ""
            return
        worker.consecutive_failures += 1
        worker.last_error = worker.last_error or "health check failed"
        if worker.healthy and worker.consecutive_failures >= self._config.health_failures_to_unhealthy:
            log.warning("worker %s unhealthy after %d failed checks", worker.url, worker.consecutive_failures)
            worker.healthy = False
