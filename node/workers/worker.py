"""One worker as this node sees it: its registration, client, circuit breaker, health verdict and load."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from node.cluster.registry import WorkerSpec
from node.routing.policy import LoadView
from node.workers.breaker import CircuitBreaker
from node.workers.client import WorkerClient
from node.workers.kv_convert import EngineLoad
from node.workers.types import ModelInfo


@dataclass(slots=True, eq=False)
class Worker:
    spec: WorkerSpec
    client: WorkerClient  # counts every Generate's outcome in ``breaker``
    breaker: CircuitBreaker
    healthy: bool = False  # this node's own verdict: in rotation here
    checked: bool = False  # this node has a verdict of its own (else the cluster's counts)
    consecutive_failures: int = 0
    excused_checks: int = 0  # failed checks not counted since the last passed one: our loop lagged through them
    in_flight: int = 0
    dispatched: int = 0  # requests this node has sent it, ever (its health checks back off while this stays put)
    #: Set on a sign the worker may be gone (its connection closed): the health loop checks it at once instead
    #: of waiting out the interval (which an idle worker stretches).
    recheck: asyncio.Event = field(default_factory=asyncio.Event)
    info: ModelInfo | None = None
    load: LoadView | None = None
    kv_events: str = "unknown"  # unknown | streaming (subscription open) | unsupported | retrying
    stream_loads: bool = False  # its KV-event stream carries load records (then GetLoads polls are skipped)
    answers_loads: bool = False  # its last GetLoads returned a load (it implements GetLoads)
    checks_without_health: int = 0  # passed checks in a row that sent GetLoads alone (no HealthCheck RPC)
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


def set_load(worker: Worker, load: EngineLoad) -> None:
    """Record an engine load report (from GetLoads or a KV-event stream) as the worker's LoadView."""
    worker.load = LoadView(
        running=load.running,
        waiting=load.waiting,
        waiting_uncached_tokens=load.waiting_uncached_tokens,
        token_usage=load.token_usage,
        gen_throughput=load.gen_throughput,
        updated_at=asyncio.get_running_loop().time() - load.age_s,
    )
