"""Prometheus metrics of one node process: a registry per node (no module-level state), served at /metrics."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from node.cluster.state import SharedState
from node.config import DEFAULT_METRICS_MAX_TENANTS
from node.http.connections import CLOSE_REASONS, ConnectionGate
from node.pipeline.events import Usage
from node.pipeline.tokenizer import Tokenizer
from node.routing.cache_aware import CacheAware
from node.telemetry import multiproc, record
from node.telemetry.buffered import BufferedCounter, BufferedHistogram, flush_all
from node.telemetry.tally import RequestTally
from node.workers.breaker import CIRCUIT_STATES
from node.workers.pool import WorkerPool

if TYPE_CHECKING:
    from mesh import Mesh


class _WorkerCollector(Collector):
    """Worker state read at scrape time, so the numbers are never stale copies."""

    def __init__(self, pool: WorkerPool) -> None:
        self._pool = pool

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        healthy = GaugeMetricFamily("smg_node_worker_healthy", "1 if the worker is in rotation.", labels=["worker"])
        in_flight = GaugeMetricFamily(
            "smg_node_worker_in_flight_requests", "Requests this node has on the worker.", labels=["worker"]
        )
        circuit = GaugeMetricFamily(
            "smg_node_worker_circuit_state",
            "1 for the state the worker's circuit breaker is in (closed, open, half_open).",
            labels=["worker", "state"],
        )
        opens = CounterMetricFamily(
            "smg_node_worker_circuit_opens", "Times the worker's circuit breaker opened.", labels=["worker"]
        )
        for w in self._pool.workers:
            healthy.add_metric([w.url], 1.0 if w.healthy else 0.0)
            in_flight.add_metric([w.url], float(w.in_flight))
            state = w.breaker.state
            for name in CIRCUIT_STATES:
                circuit.add_metric([w.url, name], 1.0 if name == state else 0.0)
            opens.add_metric([w.url], w.breaker.opens)
        yield healthy
        yield in_flight
        yield circuit
        yield opens


class _RoutingCollector(Collector):
    """Each model's KV-event index and each cache_aware pool's approximate tree, read at scrape time."""

    def __init__(self, pool: WorkerPool) -> None:
        self._pool = pool

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        indexes = self._pool.kv_indexes
        if indexes is not None:
            gauges = {
                name: GaugeMetricFamily(f"smg_node_kv_index_{name}", text, labels=["model"])
                for name, text in _KV_INDEX_GAUGES.items()
            }
            counters = {
                name: CounterMetricFamily(f"smg_node_kv_index_{name}", text, labels=["model"])
                for name, text in _KV_INDEX_COUNTERS.items()
            }
            for model, index in indexes.items():
                stats = index.stats()
                label = [model or ""]
                for name, family in gauges.items():
                    value = stats.block_size or 0 if name == "block_size_tokens" else getattr(stats, name)
                    family.add_metric(label, value)
                for name, counter in counters.items():
                    counter.add_metric(label, getattr(stats, name))
            yield from gauges.values()
            yield from counters.values()
        pages = GaugeMetricFamily(
            "smg_node_approx_tree_pages",
            "Pages of cache_aware's approximate prefix tree (workers without KV events), by model and pool.",
            labels=["model", "role"],
        )
        evicted = CounterMetricFamily(
            "smg_node_approx_tree_evicted_pages",
            "Pages evicted from cache_aware's approximate prefix tree at its bound, by model and pool.",
            labels=["model", "role"],
        )
        for (role, model), policy in self._pool.policies().items():
            if isinstance(policy, CacheAware):
                pages.add_metric([model or "", role], len(policy.tree))
                evicted.add_metric([model or "", role], policy.tree.evicted_pages)
        yield pages
        yield evicted


# KvIndexStats fields exported (block_size as block_size_tokens: it is None until learned).
_KV_INDEX_GAUGES = {
    "workers": "Workers whose KV events the model's index has taken.",
    "blocks": "Block copies in the model's KV-event index, all workers together.",
    "prefixes": "Distinct prefixes in the model's KV-event index.",
    "bytes_estimate": "Estimated memory of the model's KV-event index, in bytes.",
    "block_size_tokens": "KV block size learned from the model's events (0 until the first store).",
}
_KV_INDEX_COUNTERS = {
    "evicted_blocks": "Blocks dropped from the model's KV-event index at its bound.",
    "orphan_blocks": "Stored blocks not indexed (another block size, or a parent never seen).",
    "unknown_removals": "Removed events naming blocks the index did not hold.",
    "duplicate_batches": "KV-event batches received again and ignored.",
    "gaps": "Sequence gaps in a worker's KV events, each answered by resubscribing from the last sequence.",
}


class _TokenizerCacheCollector(Collector):
    """L0 (exact) and L1 (prefix) tokenizer cache counters, read from the cache at scrape time."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        stats = self._tokenizer.cache_stats()
        if stats is None:
            return
        lookups = CounterMetricFamily(
            "smg_node_tokenizer_cache_lookups",
            "Tokenizer cache lookups by level and result.",
            labels=["level", "result"],
        )
        size = GaugeMetricFamily("smg_node_tokenizer_cache_bytes", "Tokenizer cache memory by level.", labels=["level"])
        for level, s in (("l0", stats.l0), ("l1", stats.l1)):
            lookups.add_metric([level, "hit"], s.hits)
            lookups.add_metric([level, "miss"], s.misses)
            size.add_metric([level], s.bytes)
        yield lookups
        yield size


class _MeshCollector(Collector):
    """SWIM membership counters (mesh/metrics.py) as Prometheus families, read at scrape time."""

    def __init__(self, mesh: Mesh) -> None:
        self._mesh = mesh

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        m = self._mesh.metrics()
        members = GaugeMetricFamily(
            "smg_node_mesh_members", "Mesh members by state, as this node sees them.", labels=["state"]
        )
        for state in ("alive", "suspect", "dead", "left"):
            members.add_metric([state], getattr(m, f"members_{state}"))
        yield members
        yield GaugeMetricFamily(
            "smg_node_mesh_health_score",
            "Lifeguard local health (0 = healthy; higher = slower timeouts).",
            value=m.health_score,
        )
        for f in dataclasses.fields(m):
            if f.name.startswith("members_") or f.name == "health_score":
                continue
            yield CounterMetricFamily(
                f"smg_node_mesh_{f.name}", f"SWIM {f.name.replace('_', ' ')}.", value=getattr(m, f.name)
            )


class _StateCollector(Collector):
    """The replicated cluster state (mesh/state/) and the routing-hint channel, read at scrape time."""

    def __init__(self, shared: SharedState) -> None:
        self._shared = shared

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        m = self._shared.state.metrics()
        for name in ("docs", "doc_bytes"):
            yield GaugeMetricFamily(
                f"smg_node_state_{name}", f"Cluster state {name.replace('_', ' ')}.", value=getattr(m, name)
            )
        for f in dataclasses.fields(m):
            if f.name in ("docs", "doc_bytes"):
                continue
            yield CounterMetricFamily(
                f"smg_node_state_{f.name}", f"Cluster state {f.name.replace('_', ' ')}.", value=getattr(m, f.name)
            )
        hints = self._shared.hints
        for name in ("published", "received", "duplicates"):
            yield CounterMetricFamily(
                f"smg_node_hint_messages_{name}", f"Routing-hint messages {name}.", value=getattr(hints, name)
            )


# Histogram buckets, shaped as SMG's and vLLM's dashboards expect them:
#: SMG's default buckets (1 ms .. 240 s): HTTP duration of every route and the gateway's own queue time.
HTTP_DURATION_BUCKETS_S = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    15,
    30,
    60,
    120,
    180,
    240,
)
#: vLLM's vllm:time_to_first_token_seconds buckets.
TTFT_BUCKETS_S = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
    160.0, 640.0, 2560.0,
)  # fmt: skip
#: vLLM's vllm:time_per_output_token_seconds buckets.
TPOT_BUCKETS_S = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
#: vLLM's 1-2-5 token-count buckets (vllm:request_prompt_tokens), up to a million tokens.
TOKEN_BUCKETS = tuple(float(m * 10**e) for e in range(7) for m in (1, 2, 5))
#: Distinct worker label values one process gives its per-request series; workers past it (a registry
#: churning through many short-lived workers) are counted under "other", so the series count stays bounded.
MAX_WORKER_LABELS = 256
OTHER_WORKER = "other"
#: The tenant label of tenants past --metrics-max-tenants: tenants cannot contain ':', so no tenant is named so.
OTHER_TENANT = ":other"


class _BoundedLabel:
    """Values pass through until ``limit`` distinct ones were seen; later new values become ``other``."""

    def __init__(self, limit: int, other: str) -> None:
        self._seen: set[str] = set()
        self._limit = limit
        self._other = other

    def __call__(self, value: str) -> str:
        if value in self._seen:
            return value
        if len(self._seen) >= self._limit:
            return self._other
        self._seen.add(value)
        return value


class _LimitsCollector(Collector):
    """The limiter's refusals and whether it enforces a reduced share (cut off from part of the cluster)."""

    def __init__(self, shared: SharedState) -> None:
        self._limiter = shared.limiter

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        refused = CounterMetricFamily(
            "smg_node_rate_limited", "Requests refused 429, by the limit that refused them.", labels=["limit"]
        )
        for kind, count in self._limiter.refused.items():
            refused.add_metric([kind], count)
        yield refused
        share = self._limiter.share()
        yield GaugeMetricFamily(
            "smg_node_limits_share",
            "Share of each limit this node admits: 1 when it sees the whole cluster, less while cut off (fail-safe).",
            value=share,
        )
        yield GaugeMetricFamily(
            "smg_node_limits_degraded", "1 while this node enforces limits on a partial view.", value=float(share < 1)
        )


class _ConnectionCollector(Collector):
    """Client connections (node/http/connections.py): open, the cap, and what the bounds closed or refused."""

    def __init__(self, gate: ConnectionGate) -> None:
        self._gate = gate

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        gate = self._gate
        yield GaugeMetricFamily("smg_node_http_connections", "Open client connections.", value=gate.open)
        yield GaugeMetricFamily(
            "smg_node_http_connections_max", "The cap on open client connections.", value=gate.limits.max_connections
        )
        yield CounterMetricFamily(
            "smg_node_http_connections_refused",
            "Connections refused with a 503 at the cap while every open one was busy.",
            value=gate.refused,
        )
        yield CounterMetricFamily(
            "smg_node_http_connections_rate_limited",
            "Connections refused with a 429: their client address opened connections faster than "
            "--connection-rate-per-s (and its burst).",
            value=gate.rate_limited,
        )
        closed = CounterMetricFamily(
            "smg_node_http_connections_closed",
            "Connections the node closed: header, body or write timeout, or evicted at the cap for a new one.",
            labels=["reason"],
        )
        for reason in CLOSE_REASONS:
            closed.add_metric([reason], gate.closed[reason])
        yield closed


#: Label combinations whose metric children are kept at hand (``labels()`` costs microseconds per call); past
#: it a request's children are looked up each time. Labels are bounded, this bounds the memory of the shortcut.
MAX_CACHED_SERIES = 4096
#: With ``--processes N``: the longest a finished request's counts wait before the shared files (and so any
#: sibling's scrape) hold them; the updates of that interval are written together (node/telemetry/buffered.py).
FLUSH_DELAY_S = 0.1


class _Series:
    """The children one (route, model, status, worker) combination observes into (the worker's only with one)."""

    __slots__ = (
        "duration",
        "generation_tokens",
        "prompt_tokens",
        "queue",
        "requests",
        "tpot",
        "ttft",
        "worker_requests",
    )

    def __init__(self, m: NodeMetrics, route: str, model: str, code: str, worker: str) -> None:
        dirty = m.dirty
        self.requests = BufferedCounter(m.requests.labels(route, code), dirty)
        self.duration = BufferedHistogram(m.duration.labels(model, route, code), dirty)
        if not worker:  # a request no worker served has no per-worker series (none made, none exported)
            return
        self.worker_requests = BufferedCounter(m.worker_requests.labels(worker, code), dirty)
        self.queue = BufferedHistogram(m.queue.labels(model, route), dirty)
        self.ttft = BufferedHistogram(m.ttft.labels(model, route, worker), dirty)
        self.tpot = BufferedHistogram(m.tpot.labels(model, worker), dirty)
        self.prompt_tokens = BufferedHistogram(m.request_tokens.labels(model, route, "prompt"), dirty)
        self.generation_tokens = BufferedHistogram(m.request_tokens.labels(model, route, "generation"), dirty)


class NodeMetrics:
    """The node's metrics. ``registry`` holds the instruments; ``view`` the collectors read at scrape time.

    With ``multiproc_dir`` (``serve --processes N``) the instruments are summed over the sibling processes
    and every process's view is served labelled by ``process`` (node/telemetry/multiproc.py); this process
    must then call ``snapshot()`` every SNAPSHOT_INTERVAL_S (``run_snapshots``).
    """

    def __init__(
        self,
        pool: WorkerPool,
        *,
        multiproc_dir: str = "",
        process_index: int = 0,
        max_tenants: int = DEFAULT_METRICS_MAX_TENANTS,
    ) -> None:
        self.registry = CollectorRegistry()
        # Per-request updates waiting for ``flush`` (node/telemetry/buffered.py): at scrape, at each snapshot.
        self.dirty: list[BufferedCounter | BufferedHistogram] = []
        self._flush_due = False  # multiprocess mode: a flush is scheduled
        self._multiproc_dir = multiproc_dir
        self._process_index = process_index
        if multiproc_dir:
            multiproc.check_multiprocess_mode(multiproc_dir)
            self.view = CollectorRegistry()
            self._served = multiproc.node_registry(multiproc_dir, self.view, process_index)
            self._labelled_view = multiproc.labelled(self.view, process_index)
        else:
            self.view = self._served = self.registry
        self.requests = Counter(
            "smg_node_http_requests",
            "HTTP requests by route and status.",
            ["route", "status"],
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "smg_node_http_in_flight_requests",
            "HTTP requests being served.",
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self.tokens = Counter("smg_node_tokens", "Tokens of answered requests.", ["kind"], registry=self.registry)
        self.cached_tokens = BufferedCounter(self.tokens.labels("cached_prompt"), self.dirty)
        self.prompt_tokens = BufferedCounter(self.tokens.labels("prompt"), self.dirty)
        self.completion_tokens = BufferedCounter(self.tokens.labels("completion"), self.dirty)
        self.duration = Histogram(
            "smg_node_http_request_duration_seconds",
            "HTTP request duration from receipt to the last byte, by served model, route and status.",
            ["model", "route", "status"],
            buckets=HTTP_DURATION_BUCKETS_S,
            registry=self.registry,
        )
        self.ttft = Histogram(
            "smg_node_time_to_first_token_seconds",
            "From the request's receipt to its first output token, by model, route and worker.",
            ["model", "route", "worker"],
            buckets=TTFT_BUCKETS_S,
            registry=self.registry,
        )
        self.tpot = Histogram(
            "smg_node_time_per_output_token_seconds",
            "Mean time per output token after the first, per request, by model and worker.",
            ["model", "worker"],
            buckets=TPOT_BUCKETS_S,
            registry=self.registry,
        )
        self.queue = Histogram(
            "smg_node_request_queue_time_seconds",
            "From receipt to dispatch to a worker (template, tokenize, CPU-pool queue, routing), by model and route.",
            ["model", "route"],
            buckets=HTTP_DURATION_BUCKETS_S,
            registry=self.registry,
        )
        self.request_tokens = Histogram(
            "smg_node_request_tokens",
            "Tokens per answered request (kind prompt or generation), by model and route.",
            ["model", "route", "kind"],
            buckets=TOKEN_BUCKETS,
            registry=self.registry,
        )
        self.worker_requests = Counter(
            "smg_node_worker_requests",
            "Requests dispatched to a worker, by worker and the HTTP status the client got.",
            ["worker", "status"],
            registry=self.registry,
        )
        self.worker_errors = Counter(
            "smg_node_worker_errors",
            "Requests a worker failed (error_type: the failure's class), by worker.",
            ["worker", "error_type"],
            registry=self.registry,
        )
        self._worker_label = _BoundedLabel(MAX_WORKER_LABELS, OTHER_WORKER)
        self.tally = RequestTally()  # this process's totals, for the status page
        self._series: dict[tuple[str, str, int, str], _Series] = {}
        # Per tenant, bounded: the first ``max_tenants`` tenants keep their name (a key's tenant is chosen by an
        # admin, but a trusted X-SMG-Tenant header or a JWT claim is not, so the label must not grow unbounded).
        self._tenant_label = _BoundedLabel(max_tenants, OTHER_TENANT) if max_tenants else None
        self._tenant_series: dict[tuple[str, int], tuple[BufferedCounter, BufferedCounter, BufferedCounter]] = {}
        self.tenant_requests = Counter(
            "smg_node_tenant_requests",
            "HTTP requests by tenant and status (tenants past --metrics-max-tenants as ':other').",
            ["tenant", "status"],
            registry=self.registry,
        )
        self.tenant_tokens = Counter(
            "smg_node_tenant_tokens",
            "Tokens of requests by tenant and kind (prompt, completion; tenants past the bound as ':other').",
            ["tenant", "kind"],
            registry=self.registry,
        )
        self.auth_failures = Counter(
            "smg_node_auth_failures",
            "Requests refused 401, by reason (missing, malformed, unknown, revoked, expired).",
            ["reason"],
            registry=self.registry,
        )
        self.view.register(_WorkerCollector(pool))
        self.view.register(_RoutingCollector(pool))

    def watch_connections(self, gate: ConnectionGate) -> None:
        self.view.register(_ConnectionCollector(gate))

    def watch_mesh(self, mesh: Mesh) -> None:
        self.view.register(_MeshCollector(mesh))

    def watch_state(self, shared: SharedState) -> None:
        self.view.register(_StateCollector(shared))
        self.view.register(_LimitsCollector(shared))

    def watch_tokenizer(self, tokenizer: Tokenizer) -> None:
        self.view.register(_TokenizerCacheCollector(tokenizer))

    def observe_usage(self, usage: Usage) -> None:
        self.prompt_tokens.inc(usage.prompt_tokens)
        self.completion_tokens.inc(usage.completion_tokens)
        self.cached_tokens.inc(usage.cached_tokens)
        record.current().usage(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens)

    def observe(self, rec: record.RequestRecord, status: int, duration_s: float) -> None:
        """One finished request: its latency histograms, and its worker's counters when it reached one."""
        if self._multiproc_dir and not self._flush_due:
            # A sibling's scrape reads the shared files: they get this request within FLUSH_DELAY_S.
            self._flush_due = True
            asyncio.get_running_loop().call_later(FLUSH_DELAY_S, self.flush)
        self.tally.observe(status, rec.worker, rec.prompt_tokens, rec.cached_tokens)
        for failed, error_type in rec.worker_errors:
            self.worker_errors.labels(self._worker_label(failed), error_type).inc()
        worker = self._worker_label(rec.worker) if rec.worker else ""
        key = (rec.route, rec.model, status, worker)
        series = self._series.get(key)
        if series is None:
            series = _Series(self, rec.route, rec.model, str(status), worker)
            if len(self._series) < MAX_CACHED_SERIES:
                self._series[key] = series
        series.requests.inc()
        series.duration.observe(duration_s)
        if rec.tenant and self._tenant_label is not None:
            self._observe_tenant(self._tenant_label(rec.tenant), status, rec)
        if not worker:
            return
        series.worker_requests.inc()
        if (queue := rec.queue_s) is not None:
            series.queue.observe(queue)
        if (ttft := rec.ttft_s) is not None:
            series.ttft.observe(ttft)
        if (tpot := rec.tpot_s) is not None:
            series.tpot.observe(tpot)
        if rec.prompt_tokens or rec.completion_tokens:
            series.prompt_tokens.observe(rec.prompt_tokens)
            series.generation_tokens.observe(rec.completion_tokens)

    def _observe_tenant(self, tenant: str, status: int, rec: record.RequestRecord) -> None:
        key = (tenant, status)
        series = self._tenant_series.get(key)
        if series is None:
            series = (
                BufferedCounter(self.tenant_requests.labels(tenant, str(status)), self.dirty),
                BufferedCounter(self.tenant_tokens.labels(tenant, "prompt"), self.dirty),
                BufferedCounter(self.tenant_tokens.labels(tenant, "completion"), self.dirty),
            )
            if len(self._tenant_series) < MAX_CACHED_SERIES:
                self._tenant_series[key] = series
        requests, prompt, completion = series
        requests.inc()
        if rec.prompt_tokens:
            prompt.inc(rec.prompt_tokens)
        if rec.completion_tokens:
            completion.inc(rec.completion_tokens)

    def flush(self) -> None:
        """Apply the pending per-request updates to the instruments (what a scrape reads)."""
        self._flush_due = False
        flush_all(self.dirty)

    def snapshot(self) -> None:
        """Publish this process's view to its siblings (multiprocess mode only), pending updates first."""
        self.flush()
        if self._multiproc_dir:
            multiproc.write_snapshot(self._multiproc_dir, self._process_index, self._labelled_view)

    async def run_snapshots(self) -> None:
        while True:
            self.snapshot()
            await asyncio.sleep(multiproc.SNAPSHOT_INTERVAL_S)

    async def handle(self, request: web.Request) -> web.Response:
        self.flush()
        return web.Response(body=generate_latest(self._served), content_type="text/plain", charset="utf-8")
