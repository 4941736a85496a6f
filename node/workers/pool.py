"""The node's workers: one client each, health-checked in the background, chosen per request by a policy.

Invariants: a worker is in rotation only after a successful health check and while its circuit breaker
admits requests (``breaker``); it leaves rotation after ``health_failures_to_unhealthy`` failed checks in a
row, at once when a request to it fails to connect, and while its circuit is open (requests kept failing).
Load comes from GetLoads on every health check, and from the KV-event stream's load records where a worker
publishes them. With KV indexes (cache_aware routing), every worker's SubscribeKvEvents stream feeds the index
of the model it serves.

Policies: one per (role, served model), made on first use, so each model's pool keeps its own learned state
(trees, rings, sticky keys, dispatch credit) and reads its own model's KV index.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from node.cluster.health import HealthBoard
from node.cluster.registry import WorkerSpec
from node.config import WorkerPoolConfig
from node.errors import KvEventsUnsupported, NoHealthyWorker, WorkerFailed
from node.routing.kv_index import Resubscribe
from node.routing.kv_indexes import KvIndexes
from node.routing.policy import LoadView, RouteRequest, RoutingPolicy
from node.tasks import Supervisor
from node.workers.breaker import CircuitBreaker
from node.workers.breaker_client import BreakerClient
from node.workers.client import WorkerClient
from node.workers.kv_convert import EngineLoad
from node.workers.types import ModelInfo

log = logging.getLogger(__name__)

ClientFactory = Callable[[str], WorkerClient]
#: Makes the policy of one pool: (role, served model or None when the pool does not tell models apart).
PolicyFactory = Callable[[str, str | None], RoutingPolicy]

# A broken KV-event stream is retried after this pause, doubling up to the cap.
KV_RETRY_MIN_S = 0.5
KV_RETRY_MAX_S = 30.0


@dataclass(slots=True, eq=False)
class Worker:
    spec: WorkerSpec
    client: WorkerClient  # counts every Generate's outcome in ``breaker``
    breaker: CircuitBreaker
    healthy: bool = False  # this node's own verdict: in rotation here
    checked: bool = False  # this node has a verdict of its own (else the cluster's counts)
    consecutive_failures: int = 0
    in_flight: int = 0
    info: ModelInfo | None = None
    load: LoadView | None = None
    kv_events: str = "unknown"  # unknown | streaming | unsupported | retrying
    stream_loads: bool = False  # its KV-event stream carries load records (then GetLoads polls are skipped)
    last_error: str = field(default="")
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def url(self) -> str:
        return self.client.url

    @property
    def role(self) -> str:
        return self.spec.role

    @property
    def model(self) -> str:
        """The model it serves: as registered, else as its GetModelInfo reports ("" before it answers)."""
        if self.spec.model:
            return self.spec.model
        return self.info.served_model_name if self.info is not None else ""


class WorkerPool:
    """The workers this node routes to, following the cluster's registry (``sync``)."""

    def __init__(
        self,
        config: WorkerPoolConfig,
        *,
        client_factory: ClientFactory,
        policies: PolicyFactory,
        policy_name: str,
        breakers: Callable[[], CircuitBreaker],
        supervisor: Supervisor,
        kv_indexes: KvIndexes | None = None,
        board: HealthBoard | None = None,
        model_of: Callable[[Worker], str | None] | None = None,
    ) -> None:
        """``policies(role, model)`` makes the policy of a pool; ``policy_name`` is the default's (shown);
        ``breakers()`` makes a worker's circuit breaker.
        ``model_of`` says which served model a worker belongs to (None: not known yet, or none we serve);
        without it every worker serves every model and there is one KV index."""
        self._config = config
        self._make_policy = policies
        self._policy_name = policy_name
        self._policies: dict[tuple[str, str | None], RoutingPolicy] = {}
        self._model_of = model_of
        self._supervisor = supervisor
        self._kv_indexes = kv_indexes
        self._board = board
        self._client_factory = client_factory
        self._new_breaker = breakers
        self._workers: dict[str, Worker] = {}
        self._started = False
        self._model_info_ready = asyncio.Event()
        specs = [WorkerSpec(url=url) for url in config.workers]
        specs += [WorkerSpec(url=url, role="prefill") for url in config.prefill_workers]
        specs += [WorkerSpec(url=url, role="decode") for url in config.decode_workers]
        self.sync({spec.id: spec for spec in specs})

    @property
    def workers(self) -> Sequence[Worker]:
        return list(self._workers.values())

    def get(self, wid: str) -> Worker | None:
        return self._workers.get(wid)

    @property
    def policy_name(self) -> str:
        return self._policy_name

    @property
    def kv_indexes(self) -> KvIndexes | None:
        return self._kv_indexes

    def policies(self) -> dict[tuple[str, str | None], RoutingPolicy]:
        """Every policy made so far, by (role, model)."""
        return dict(self._policies)

    @property
    def board(self) -> HealthBoard | None:
        return self._board

    def routable(self, worker: Worker) -> bool:
        """In rotation on this node: its circuit admits requests, and our own health verdict once we have
        one, else the cluster's."""
        if not worker.breaker.admits():
            return False
        if worker.healthy:
            return True
        if worker.checked or self._board is None:
            return False
        return self._board.cluster_ok(worker.id) is True

    def healthy(self, role: str = "regular", model: str | None = None) -> list[Worker]:
        """Workers of ``role`` in rotation here; with ``model``, only those serving it."""
        out = [w for w in self._workers.values() if w.role == role and self.routable(w)]
        if model is not None and self._model_of is not None:
            out = [w for w in out if self._model_of(w) == model]
        return out

    def sync(self, specs: Mapping[str, WorkerSpec]) -> None:
        """Make the pool hold exactly ``specs`` (the registry's workers): start watching new ones, stop
        and close removed ones. A changed spec (same URL, new model/role/labels) is updated in place."""
        changed = False
        for wid in [wid for wid in self._workers if wid not in specs]:
            worker = self._workers.pop(wid)
            for task in worker.tasks:
                task.cancel()
            if self._kv_indexes is not None:
                self._kv_indexes.forget_worker(worker.url)
            if self._board is not None:
                self._board.forget(wid)
            if self._started:
                self._supervisor.spawn(worker.client.close(), name=f"close-{worker.url}")
            log.info("worker %s (%s) removed", worker.url, wid)
            changed = True
        for wid, spec in specs.items():
            existing = self._workers.get(wid)
            if existing is not None:
                changed = changed or existing.spec.role != spec.role  # it moves to another role's policy
                existing.spec = spec
                continue
            breaker = self._new_breaker()
            worker = Worker(spec=spec, client=BreakerClient(self._client_factory(spec.url), breaker), breaker=breaker)
            self._workers[wid] = worker
            if self._started:
                self._watch(worker)
                log.info("worker %s (%s) added", spec.url, wid)
            changed = True
        if changed and self._started:
            self._tell_policies()

    def _policy_of(self, role: str, model: str | None) -> RoutingPolicy:
        policy = self._policies.get((role, model))
        if policy is None:
            policy = self._policies[(role, model)] = self._make_policy(role, model)
            policy.on_workers_changed(self._urls_for(role))
        return policy

    def _urls_for(self, role: str) -> list[str]:
        # A regular pool's policy hears of every worker: which model a worker serves may be known only after
        # its first health check, and policies only ever choose among the candidates they are given.
        return [w.url for w in self._workers.values() if role in ("regular", w.role)]

    def _tell_policies(self) -> None:
        for (role, _), policy in self._policies.items():
            policy.on_workers_changed(self._urls_for(role))

    def can_serve(self, model: str | None = None) -> bool:
        """A request (for ``model``) could be routed now: a regular worker, or a prefill and a decode one."""
        return bool(self.healthy(model=model)) or self.disaggregated(model)

    def disaggregated(self, model: str | None = None) -> bool:
        """Prefill/decode mode: at least one prefill and one decode worker (of ``model``) are in rotation."""
        return bool(self.healthy("prefill", model)) and bool(self.healthy("decode", model))

    def start(self) -> None:
        self._started = True
        self._tell_policies()
        for worker in self._workers.values():
            self._watch(worker)

    def _watch(self, worker: Worker) -> None:
        worker.tasks.append(self._supervisor.spawn(self._health_loop(worker), name=f"health-{worker.url}"))
        if self._kv_indexes is not None:
            worker.tasks.append(
                self._supervisor.spawn(self._kv_loop(worker, self._kv_indexes), name=f"kv-events-{worker.url}")
            )

    async def close(self) -> None:
        await asyncio.gather(*(w.client.close() for w in self._workers.values()), return_exceptions=True)

    def select(self, request: RouteRequest, *, role: str = "regular") -> Worker:
        """Pick a worker of ``role`` for ``request`` and tell the policy and its breaker; raises NoHealthyWorker
        (503) when none is in rotation (unhealthy or circuit open). Workers in ``request.exclude`` are chosen only
        when no other is in rotation. Synchronous on purpose: select and
        on_routed happen with no await in between."""
        candidates = self.healthy(role, request.model)
        if not candidates:
            what = "worker" if role == "regular" else f"{role} worker"
            raise NoHealthyWorker(f"no healthy {what} is available to serve this request; try again later")
        if request.exclude:
            # A retry goes elsewhere if it can; with no other worker, back to one it failed on (after backoff).
            candidates = [w for w in candidates if w.url not in request.exclude] or candidates
        stamped = replace(request, now_s=asyncio.get_running_loop().time())
        policy = self._policy_of(role, request.model)
        chosen = policy.select(candidates, stamped)
        policy.on_routed(chosen, stamped)
        chosen.breaker.on_dispatch()
        return chosen

    def report_failure(self, worker: Worker, error: WorkerFailed) -> None:
        """A request could not reach ``worker``: take it out of rotation until a health check passes."""
        if worker.healthy:
            log.warning("worker %s out of rotation: %s", worker.url, error.message)
        worker.healthy = False
        worker.checked = True
        worker.last_error = error.message
        self._publish(worker)

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
        return next((w.info for w in self._workers.values() if w.info is not None), None)

    def _set_load(self, worker: Worker, load: EngineLoad) -> None:
        worker.load = LoadView(
            running=load.running,
            waiting=load.waiting,
            waiting_uncached_tokens=load.waiting_uncached_tokens,
            token_usage=load.token_usage,
            gen_throughput=load.gen_throughput,
            updated_at=asyncio.get_running_loop().time() - load.age_s,
        )

    async def _health_loop(self, worker: Worker) -> None:
        # Fixed rate: a check starts every interval whatever the last one took (at most one interval, see
        # _check), so a worker that stops answering fails ``health_failures_to_unhealthy`` checks within that
        # many intervals plus one, however long --health-timeout-s is.
        loop = asyncio.get_running_loop()
        interval = self._config.health_interval_s
        next_at = loop.time()
        while True:
            await self._check(worker)
            next_at = max(next_at + interval, loop.time())  # after a stall, no burst of checks to catch up
            await asyncio.sleep(next_at - loop.time())

    def _publish(self, worker: Worker) -> None:
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
        """Health, then (once) the model info and the load; False with ``last_error`` set on a failure."""
        ok = await worker.client.health(timeout_s=rpc_timeout_s)
        try:
            if ok and worker.info is None:
                worker.info = await worker.client.model_info(timeout_s=rpc_timeout_s)
                self._model_info_ready.set()
            if ok and not (worker.kv_events == "streaming" and worker.stream_loads):  # those are fresher
                load = await worker.client.loads(timeout_s=rpc_timeout_s)
                if load is not None:
                    self._set_load(worker, load)
        except WorkerFailed as exc:
            ok = False
            worker.last_error = exc.message
        return ok

    async def _check(self, worker: Worker) -> None:
        # One deadline for the whole check (health, model info, load), never past the next check's start: a
        # worker that accepts connections but never answers (hung, SIGSTOPped) fails at that boundary.
        budget = min(self._config.health_timeout_s, self._config.health_interval_s)
        try:
            async with asyncio.timeout(budget):
                ok = await self._probe(worker, budget)
        except TimeoutError:
            ok = False
            worker.last_error = f"no answer to the health check within {budget:g} s"
        if ok:
            if not worker.healthy:
                was = "back in rotation after an outage" if worker.checked else "in rotation"
                log.info("worker %s healthy: %s", worker.url, was)
            worker.healthy = True
            worker.checked = True
            worker.consecutive_failures = 0
            worker.last_error = ""
            self._publish(worker)
            return
        worker.consecutive_failures += 1
        worker.last_error = worker.last_error or "health check failed"
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
        self._publish(worker)

    def _indexed_model(self, worker: Worker) -> tuple[bool, str | None]:
        """(known, model): the model whose KV index ``worker`` feeds; not known before its model is."""
        if self._model_of is None:
            return True, None
        model = self._model_of(worker)
        return model is not None, model

    async def _kv_loop(self, worker: Worker, indexes: KvIndexes) -> None:
        """Feed its model's index from the worker's KV events, resubscribing after gaps and broken streams."""
        pause = KV_RETRY_MIN_S
        while True:
            known, model = self._indexed_model(worker)
            if not known:  # a worker's model is learned at a health check (or once the models are loaded)
                await asyncio.sleep(self._config.health_interval_s)
                continue
            index = indexes.of(model)
            try:
                again = False
                async for batch, load in worker.client.kv_events(index.resume_from(worker.url)):
                    worker.kv_events = "streaming"
                    pause = KV_RETRY_MIN_S
                    if load is not None:
                        worker.stream_loads = True
                        self._set_load(worker, load)
                    if self._indexed_model(worker) != (True, model):  # re-registered for another model
                        log.info("worker %s now serves another model: resubscribing", worker.url)
                        index.forget_worker(worker.url)
                        again = True
                        break
                    if batch is not None and isinstance(index.apply(worker.url, batch), Resubscribe):
                        log.info("KV events of %s skipped batches: resubscribing", worker.url)
                        again = True
                        break
                if not again:  # the worker ended the stream: reconnect, but never in a tight loop
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, KV_RETRY_MAX_S)
            except KvEventsUnsupported:
                worker.kv_events = "unsupported"
                log.info("worker %s publishes no KV events: routing learns from its own decisions", worker.url)
                return
            except WorkerFailed as exc:
                worker.kv_events = "retrying"
                log.debug("KV events of %s: %s", worker.url, exc.message)
                await asyncio.sleep(pause)
                pause = min(pause * 2, KV_RETRY_MAX_S)
