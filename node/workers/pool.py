"""The node's workers: one client each, health-checked in the background, chosen per request by a policy.

Invariants: a worker is in rotation only after a successful health check and while its circuit breaker
admits requests (``breaker``); it leaves rotation after ``health_failures_to_unhealthy`` failed checks in a
row, at once when a request to it fails to connect, and while its circuit is open (requests kept failing).
Load comes from GetLoads on every health check, and from the KV-event stream's load records where a worker
publishes them. With KV indexes (cache_aware routing), every worker's SubscribeKvEvents stream feeds the index
of the model it serves.

Policies: one per (role, served model), made on first use, so each model's pool keeps its own learned state
(trees, rings, sticky keys, dispatch credit) and reads its own model's KV index.

This module is the facade: it follows the registry (``sync``, ``vet``) and selects; the health loop is
``health_check``, the KV-event subscriber ``kv_subscriber``, a worker's state ``worker``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence

from node.cluster.health import HealthBoard
from node.cluster.registry import WorkerSpec
from node.config import WorkerPoolConfig
from node.errors import NoHealthyWorker, WorkerFailed
from node.routing.kv_indexes import KvIndexes
from node.routing.policy import RouteRequest, RoutingPolicy
from node.tasks import Supervisor
from node.workers.breaker import CircuitBreaker
from node.workers.breaker_client import BreakerClient
from node.workers.client import WorkerClient
from node.workers.health_check import HealthChecker
from node.workers.kv_subscriber import follow_kv_events
from node.workers.types import ModelInfo
from node.workers.worker import Worker
from node.workers.worker_address import (
    Resolver,
    WorkerAddressError,
    WorkerUnresolved,
    checked_addresses,
    system_resolve,
)
from node.workers.worker_url import parse_target

log = logging.getLogger(__name__)

#: ``Worker`` stays importable from here, where callers have always found it.
__all__ = ["ClientFactory", "PolicyFactory", "Worker", "WorkerPool"]

ClientFactory = Callable[[str], WorkerClient]
#: Makes the policy of one pool: (role, served model or None when the pool does not tell models apart).
PolicyFactory = Callable[[str, str | None], RoutingPolicy]


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
        loop_lag: Callable[[float], float] = lambda _within_s: 0.0,
        resolve: Resolver = system_resolve,
    ) -> None:
        """``policies(role, model)`` makes the policy of a pool; ``policy_name`` is the default's (shown);
        ``breakers()`` makes a worker's circuit breaker.
        ``model_of`` says which served model a worker belongs to (None: not known yet, or none we serve);
        without it every worker serves every model and there is one KV index.
        ``loop_lag(within_s)`` is this node's worst event-loop lag of the last ``within_s`` seconds
        (``LoopLagMonitor.recent_lag_s``). ``resolve`` looks worker names up at registration."""
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
        self._policy = config.network_policy
        self._resolve = resolve
        self._refused: set[str] = set()  # registry entries this node will not connect to (logged once each)
        self._started = False
        self._model_info_ready = asyncio.Event()
        self._health = HealthChecker(config, board=board, loop_lag=loop_lag, on_model_info=self._model_info_ready.set)
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

    def vet(self, spec: WorkerSpec, registered: int) -> None:
        """Check a registration before it enters the registry, which holds ``registered`` workers now.

        Raises ValueError, its message starting with the offending field (``url:``), when ``spec`` points
        outside this node's allowed networks or would exceed ``max_workers``.
        """
        try:
            self._policy.check(spec.url, parse_target(spec.url))
        except ValueError as exc:
            raise ValueError(f"url: {exc}") from None
        if spec.id not in self._workers and registered >= self._config.max_workers:
            raise ValueError(f"url: the cluster already has {registered} workers, the most this node allows")

    async def vet_addresses(self, spec: WorkerSpec) -> None:
        """After ``vet``: every address the URL's host name resolves to lies inside this node's network
        policy (an IP literal was checked by ``vet``). A name that does not resolve is refused only when
        allowed networks are configured (nothing proves it inside them); otherwise it may come into DNS later,
        and the client checks it before connecting.

        Raises ValueError starting with ``url:`` naming the address.
        """
        target = parse_target(spec.url)
        if target.ip is not None:
            return
        try:
            await checked_addresses(spec.url, target, self._policy, resolve=self._resolve)
        except WorkerUnresolved as exc:
            if self._policy.allowed:
                raise ValueError(f"url: {exc}; with --worker-allowed-networks a name must resolve") from None
        except WorkerAddressError as exc:
            raise ValueError(f"url: {exc}") from None

    def _admitted(self, specs: Mapping[str, WorkerSpec]) -> dict[str, WorkerSpec]:
        """The registry's workers this node connects to, in the registry's order: inside its network policy,
        at most ``max_workers`` (those it has first, then by id). Another node may have looser settings; ours
        bound what we hold."""
        chosen: set[str] = set()
        for wid in sorted(specs, key=lambda wid: (wid not in self._workers, wid)):
            spec = specs[wid]
            try:
                self._policy.check(spec.url, parse_target(spec.url))
                if len(chosen) >= self._config.max_workers:
                    raise ValueError(f"more than max_workers ({self._config.max_workers}) are registered")
            except ValueError as exc:
                if wid not in self._refused:
                    log.warning("not connecting to registered worker %s: %s", spec.url, exc)
                    self._refused.add(wid)
                continue
            chosen.add(wid)
        self._refused &= specs.keys()
        return {wid: spec for wid, spec in specs.items() if wid in chosen}

    def sync(self, specs: Mapping[str, WorkerSpec]) -> None:
        """Make the pool hold exactly ``specs`` (the registry's workers; those ``_admitted`` here): start
        watching new ones, stop and close removed ones. A changed spec (same URL, new model/role/labels) is
        updated in place."""
        specs = self._admitted(specs)
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
        worker.tasks.append(self._supervisor.spawn(self._health.run(worker), name=f"health-{worker.url}"))
        worker.tasks.append(self._supervisor.spawn(self._watch_connection(worker), name=f"connection-{worker.url}"))
        if self._kv_indexes is not None:
            kv = follow_kv_events(
                worker, self._kv_indexes, model_of=self._model_of, recheck_s=self._config.health_interval_s
            )
            worker.tasks.append(self._supervisor.spawn(kv, name=f"kv-events-{worker.url}"))

    async def _watch_connection(self, worker: Worker) -> None:
        """A lost connection brings the worker's next health check forward (an idle worker's waits several
        intervals): a worker process that exits is out within a check or two, whatever the backoff."""
        while True:
            try:
                await worker.client.connection_lost()
            except WorkerFailed:
                await asyncio.sleep(self._config.health_interval_s)  # nothing to watch yet
                continue
            worker.recheck.set()

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
        # Built field by field: dataclasses.replace introspects the fields on every call (2.3 vs 1.5 µs).
        stamped = RouteRequest(
            prompt_ids=request.prompt_ids,
            routing_key=request.routing_key,
            now_s=asyncio.get_running_loop().time(),
            model=request.model,
            exclude=request.exclude,
        )
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
        self._health.publish(worker)

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
