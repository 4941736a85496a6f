"""Cluster-wide limits over the mesh's counters: requests and tokens per minute per scope (an API key, a
tenant), counted by ``ClusterState.incr``; concurrent requests as each node's in-flight counts, published in
its row of the ``inflight`` table every tick and summed over live nodes.

Over-admission: a node sees its own admissions exactly and each peer's as of that peer's last flush plus
gossip; with N nodes each admitting at rate r a window admits at most ``limit + (N - 1) x r x (tick +
propagation)`` (mesh/state/counters.py; measured in bench/RESULTS.md "Limits"). Concurrency has the same
form with the in-flight publication.

Fail-safe, not fail-open: the node enforces ``limit x share`` (node/auth/limits.py), ``share`` = the members
it is synced with among the most it has seen alive over ``PEAK_MEMORY_S``. Cut off from the others, it keeps
enforcing its share on its own count; ``degraded`` says so (the ``smg_node_limits_degraded`` metric).

A scope whose counter cannot be kept (``StateLimitError``: the node counts too many) is refused ("capacity"),
never admitted uncounted.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

from mesh.state import ClusterState, StateLimitError
from node.auth.identity import Limits
from node.auth.limits import WINDOW_S, Usage, Verdict, judge

INFLIGHT_TABLE: Final = "inflight"
#: The in-flight row is split over this many documents (field-level sharding) so one scope's change is a
#: small delta; a field is ~40 bytes, so MAX_INFLIGHT_SCOPES fill each shard about halfway.
INFLIGHT_SHARDS: Final = 4
#: Scopes with requests in flight on one node; past it a new scope is refused ("capacity") rather than
#: admitted uncounted.
MAX_INFLIGHT_SCOPES: Final = 1024
#: How long the largest cluster seen is remembered as the expected size (a node that left for good stops
#: shrinking everyone's share after this).
PEAK_MEMORY_S: Final = 600.0
#: Peers' admissions this node cannot see yet: each publishes its counters every tick (0.25 s) and gossip
#: carries them in about another (measured p50 ~0.12 s for a registry change on 3 LAN nodes). Their recent
#: admission rate times this is added to what a node sees (``_PeerRate``), which removes most of the
#: over-admission under load spread over the nodes and none of the budget when only this node is loaded.
BLIND_S: Final = 0.4
#: Peers' rate per scope is re-measured at most this often (shorter samples are mostly gossip jitter).
RATE_SAMPLE_S: Final = 0.25
#: Scopes whose peer rate is remembered; the oldest measured are forgotten first (an estimate, not a count).
MAX_RATE_SCOPES: Final = 4096
_REQUESTS: Final = "rq"
_TOKENS: Final = "tk"
_REFUNDS: Final = "tkr"


def key_scope(key_id: str) -> str:
    return f"k:{key_id}"


def tenant_scope(tenant: str) -> str:
    """Tenants may be 256 characters: the counter key is a fixed-size digest."""
    return "t:" + hashlib.sha256(tenant.encode()).hexdigest()[:24]


@dataclass(slots=True)
class _PeerRate:
    """The cluster-wide request count of one scope less our own admissions, sampled: their growth rate is
    the peers' admission rate."""

    at: float
    window: int
    peers: int
    own: int = 0
    rate: float = 0.0


@dataclass(frozen=True, slots=True)
class Scope:
    key: str
    limits: Limits


@dataclass(slots=True)
class Admission:
    """An admitted request: settle it once with its actual token usage."""

    scopes: tuple[Scope, ...]
    epoch: int
    reserved: int
    headers: dict[str, str] = field(default_factory=dict)
    settled: bool = False


@dataclass(frozen=True, slots=True)
class Refusal:
    verdict: Verdict
    scope: Scope


class ClusterLimiter:
    """Call on the state's owner (the event loop) only."""

    def __init__(
        self,
        state: ClusterState,
        *,
        alive: Callable[[], Sequence[str] | None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._state = state
        self._alive = alive
        self._clock = clock
        self._inflight: dict[str, int] = {}
        self._dirty = False
        self._peak = 1
        self._peak_at = clock()
        self._rates: dict[str, _PeerRate] = {}
        self.refused = {"requests": 0, "tokens": 0, "concurrent": 0, "capacity": 0}

    # -- the cluster's view --

    def share(self) -> float:
        """The part of the cluster whose counts this node sees (1 standalone)."""
        alive = self._alive()
        if alive is None:
            return 1.0
        now = self._clock()
        live = set(alive)
        if len(live) >= self._peak or now - self._peak_at > PEAK_MEMORY_S:
            self._peak, self._peak_at = max(1, len(live)), now
        synced = 1 + len((self._state.synced_peers() & live) - {self._state.node_id})
        return min(1.0, synced / self._peak)

    @property
    def degraded(self) -> bool:
        return self.share() < 1.0

    def usage(self, scope: str, now: float) -> Usage:
        tokens = self._state.count(scope, _TOKENS, WINDOW_S, now) - self._state.count(scope, _REFUNDS, WINDOW_S, now)
        return Usage(
            requests=self._state.count(scope, _REQUESTS, WINDOW_S, now),
            tokens=max(0, tokens),
            concurrent=self._inflight.get(scope, 0) + self._peer_inflight(scope),
        )

    def _unseen(self, scope: str, requests: int, now: float) -> int:
        """Peers' admissions of ``scope`` we cannot see yet: their measured rate times BLIND_S."""
        window = int(now // WINDOW_S)
        sample = self._rates.get(scope)
        if sample is None or sample.window != window:
            if sample is None and len(self._rates) >= MAX_RATE_SCOPES:
                del self._rates[next(iter(self._rates))]
            self._rates[scope] = _PeerRate(now, window, requests)
            return 0
        if now - sample.at >= RATE_SAMPLE_S:
            peers = requests - sample.own
            sample.rate = max(0.0, (peers - sample.peers) / (now - sample.at))
            sample.at, sample.peers = now, peers
        return round(sample.rate * BLIND_S)

    def _admitted_here(self, scope: str) -> None:
        sample = self._rates.get(scope)
        if sample is not None:
            sample.own += 1

    def _peer_inflight(self, scope: str) -> int:
        total = 0
        for node, row in self._state.rows(INFLIGHT_TABLE, live_only=True).items():
            value = row.get(scope) if node != self._state.node_id else None
            if isinstance(value, int) and value > 0:
                total += value
        return total

    # -- admission --

    def admit(self, scopes: Sequence[Scope], *, reserve_tokens: int = 0) -> Admission | Refusal:
        """Admit one request under every scope's limits, or name the first that refuses it. The admission
        carries the x-ratelimit-* headers of the first scope that has rate limits."""
        now = self._clock()
        share = self.share()
        headers: dict[str, str] = {}
        for scope in scopes:
            used = self.usage(scope.key, now)
            if scope.limits.requests_per_minute and self._alive() is not None:
                pending = self._unseen(scope.key, used.requests, now)
                used = Usage(used.requests + pending, used.tokens, used.concurrent)
            verdict = judge(scope.limits, used, share=share, now=now, reserve_tokens=reserve_tokens)
            if verdict.refused is not None:
                self.refused[verdict.refused] += 1
                return Refusal(verdict, scope)
            if not headers:
                headers = dict(verdict.headers)
        if any(s.limits.concurrent for s in scopes) and len(self._inflight) >= MAX_INFLIGHT_SCOPES:
            new = [s for s in scopes if s.limits.concurrent and s.key not in self._inflight]
            if new:
                return self._capacity(new[0], now)
        try:
            for scope in scopes:
                if scope.limits.requests_per_minute:
                    self._state.incr(scope.key, _REQUESTS, WINDOW_S, now)
                    self._admitted_here(scope.key)
                if scope.limits.tokens_per_minute and reserve_tokens:
                    self._state.incr(scope.key, _TOKENS, WINDOW_S, now, reserve_tokens)
        except StateLimitError:
            return self._capacity(scope, now)
        for scope in scopes:
            if scope.limits.concurrent:
                self._inflight[scope.key] = self._inflight.get(scope.key, 0) + 1
                self._dirty = True
        return Admission(tuple(scopes), int(now // WINDOW_S), reserve_tokens, headers)

    def reserve(self, admission: Admission, tokens: int) -> Refusal | None:
        """Reserve ``tokens`` (the prompt plus the requested output budget, known once the request is
        prepared) for an admitted request under each of its token limits, or name the first scope that
        cannot hold them (nothing reserved then). Settling refunds what the request did not use; the
        reservation's window becomes the admission's, so a request admitted just before a window turned is
        refunded in the window it was charged in."""
        now = self._clock()
        share = self.share()
        metered = [s for s in admission.scopes if s.limits.tokens_per_minute]
        if admission.settled or tokens <= 0 or not metered:
            return None
        verdicts = []
        for scope in metered:
            used = self.usage(scope.key, now)
            verdict = judge(
                Limits(tokens_per_minute=scope.limits.tokens_per_minute),
                used,
                share=share,
                now=now,
                reserve_tokens=tokens,
            )
            if verdict.refused is not None:
                self.refused["tokens"] += 1
                return Refusal(verdict, scope)
            verdicts.append(verdict)
        # An earlier reservation charged in a window that has since turned is no longer refundable.
        kept = admission.reserved if int(now // WINDOW_S) == admission.epoch else 0
        try:
            for scope in metered:
                self._state.incr(scope.key, _TOKENS, WINDOW_S, now, tokens)
        except StateLimitError:
            return self._capacity(scope, now)
        admission.epoch = int(now // WINDOW_S)
        admission.reserved = kept + tokens
        admission.headers.update({k: v for k, v in verdicts[0].headers.items() if k.endswith("-tokens")})
        return None

    def _capacity(self, scope: Scope, now: float) -> Refusal:
        self.refused["capacity"] += 1
        return Refusal(Verdict("capacity", 1.0, {"Retry-After": "1"}), scope)

    def settle(self, admission: Admission, tokens_used: int) -> None:
        """The request is over: release its concurrency and charge its actual tokens (the reservation's
        unused part is refunded within the same window only; a refund into the next window would lend it
        budget it never reserved)."""
        if admission.settled:
            return
        admission.settled = True
        now = self._clock()
        same_window = int(now // WINDOW_S) == admission.epoch
        for scope in admission.scopes:
            if scope.limits.concurrent:
                left = self._inflight.get(scope.key, 0) - 1
                if left > 0:
                    self._inflight[scope.key] = left
                else:
                    self._inflight.pop(scope.key, None)
                self._dirty = True
            if not scope.limits.tokens_per_minute:
                continue
            try:
                extra = tokens_used - admission.reserved if same_window else tokens_used
                if extra > 0:
                    self._state.incr(scope.key, _TOKENS, WINDOW_S, now, extra)
                elif extra < 0:
                    self._state.incr(scope.key, _REFUNDS, WINDOW_S, now, -extra)
            except StateLimitError:
                self.refused["capacity"] += 1  # counted in the metric; the request has already run

    def tick(self) -> None:
        """Publish our in-flight counts if they changed (the shared state's ticker calls it)."""
        if self._dirty:
            self._state.set_row(INFLIGHT_TABLE, dict(self._inflight))
            self._dirty = False
