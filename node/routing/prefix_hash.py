"""Prefix hashing: the first ``prefix_hash_tokens`` prompt tokens pick a worker on a consistent-hash ring,
so prompts sharing that prefix meet the same worker's prefix cache, with no state kept per prefix.

Load escape: a worker whose load exceeds ``load_factor`` times the pool mean, and the mean by
``prefix_hash_balance_abs_threshold`` requests, is passed over for the next worker clockwise (the same next
worker for every prompt of that prefix, so affinity degrades to a second cache, not to chaos). When every
worker is overloaded, the least loaded is chosen.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from node.routing.consistent_hashing import ring_candidates
from node.routing.load import DispatchCredit, argmin, request_loads
from node.routing.policy import C, Candidate, RouteRequest
from node.routing.ring import HashRing, ring_hash


def prefix_key(prompt_ids: Sequence[int], tokens: int) -> int:
    """The ring position of a prompt's first ``tokens`` token ids (uint32, as the engine's proto carries them)."""
    return ring_hash(array("I", prompt_ids[:tokens]).tobytes())


class PrefixHash:
    name = "prefix_hash"

    def __init__(
        self,
        *,
        prefix_tokens: int,
        load_factor: float,
        balance_abs_threshold: int,
        virtual_nodes: int,
        load_stale_after_s: float,
    ) -> None:
        self._prefix_tokens = prefix_tokens
        self._load_factor = load_factor
        self._abs_threshold = balance_abs_threshold
        self._stale_after_s = load_stale_after_s
        self._ring = HashRing(virtual_nodes)
        self._credit = DispatchCredit()

    def select(self, candidates: Sequence[C], request: RouteRequest) -> C:
        by_url = ring_candidates(self._ring, candidates)
        loads = request_loads(candidates, self._credit, request.now_s, self._stale_after_s)
        load_of = {c.url: load for c, load in zip(candidates, loads, strict=True)}
        mean = sum(loads) / len(loads)
        ceiling = max(self._load_factor * mean, mean + self._abs_threshold)
        key = prefix_key(request.prompt_ids, self._prefix_tokens)
        url = self._ring.find(key, lambda u: u in by_url and load_of[u] <= ceiling)
        return by_url[url] if url is not None else candidates[argmin(loads)]

    def on_routed(self, candidate: Candidate, request: RouteRequest) -> None:
        self._credit.record(candidate.url, request.now_s, len(request.prompt_ids))

    def on_workers_changed(self, urls: Sequence[str]) -> None:
        self._ring.rebuild(urls)
        self._credit.retain(urls)
