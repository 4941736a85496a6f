"""Prometheus metrics of one node process: a registry per node (no module-level state), served at /metrics."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Iterator

from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from mesh import Mesh
from node.cluster.state import SharedState
from node.http.connections import CLOSE_REASONS, ConnectionGate
from node.pipeline.events import Usage
from node.pipeline.tokenizer import Tokenizer
from node.routing.cache_aware import CacheAware
from node.workers.breaker import CIRCUIT_STATES
from node.workers.pool import WorkerPool

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# Route patterns are the label, never raw paths: a client cannot blow up the label cardinality.
_UNMATCHED = "unmatched"


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
        closed = CounterMetricFamily(
            "smg_node_http_connections_closed",
            "Connections the node closed: header, body or write timeout, or evicted at the cap for a new one.",
            labels=["reason"],
        )
        for reason in CLOSE_REASONS:
            closed.add_metric([reason], gate.closed[reason])
        yield closed


class NodeMetrics:
    def __init__(self, pool: WorkerPool) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "smg_node_http_requests",
            "HTTP requests by route and status.",
            ["route", "status"],
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "smg_node_http_in_flight_requests", "HTTP requests being served.", registry=self.registry
        )
        self.tokens = Counter("smg_node_tokens", "Tokens of answered requests.", ["kind"], registry=self.registry)
        self.cached_tokens = self.tokens.labels("cached_prompt")
        self.prompt_tokens = self.tokens.labels("prompt")
        self.completion_tokens = self.tokens.labels("completion")
        self.auth_failures = Counter(
            "smg_node_auth_failures",
            "Requests refused 401, by reason (missing, malformed, unknown, revoked, expired).",
            ["reason"],
            registry=self.registry,
        )
        self.registry.register(_WorkerCollector(pool))
        self.registry.register(_RoutingCollector(pool))

    def watch_connections(self, gate: ConnectionGate) -> None:
        self.registry.register(_ConnectionCollector(gate))

    def watch_mesh(self, mesh: Mesh) -> None:
        self.registry.register(_MeshCollector(mesh))

    def watch_state(self, shared: SharedState) -> None:
        self.registry.register(_StateCollector(shared))
        self.registry.register(_LimitsCollector(shared))

    def watch_tokenizer(self, tokenizer: Tokenizer) -> None:
        self.registry.register(_TokenizerCacheCollector(tokenizer))

    def observe_usage(self, usage: Usage) -> None:
        self.prompt_tokens.inc(usage.prompt_tokens)
        self.completion_tokens.inc(usage.completion_tokens)
        self.cached_tokens.inc(usage.cached_tokens)

    def middleware(self) -> Middleware:
        @web.middleware
        async def count(request: web.Request, handler: Handler) -> web.StreamResponse:
            info = request.match_info.route.resource
            route = info.canonical if info is not None else _UNMATCHED
            self.in_flight.inc()
            status = 499  # the client went away before an answer (nginx's convention)
            try:
                resp = await handler(request)
                status = resp.status
                return resp
            finally:
                self.in_flight.dec()
                self.requests.labels(route, str(status)).inc()

        return count

    async def handle(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry), content_type="text/plain", charset="utf-8")
