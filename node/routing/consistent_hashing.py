"""Consistent hashing on the routing key (``X-SMG-Routing-Key`` or the configured header).

The same key goes to the same worker while it is healthy; when it is not, to the next worker clockwise,
and back once it recovers. Workers joining or leaving move only about 1/N of the keys. A request without
a key goes to a random worker.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from node.routing.policy import C, Candidate, RouteRequest
from node.routing.ring import HashRing, ring_hash


class ConsistentHashing:
    name = "consistent_hashing"

    def __init__(self, rng: random.Random, *, virtual_nodes: int) -> None:
        self._rng = rng
        self._ring = HashRing(virtual_nodes)

    def select(self, candidates: Sequence[C], request: RouteRequest) -> C:
        if request.routing_key is None:
            return candidates[self._rng.randrange(len(candidates))]
        by_url = ring_candidates(self._ring, candidates)
        url = self._ring.find(ring_hash(request.routing_key.encode()), by_url.__contains__)
        return by_url[url] if url is not None else candidates[0]

    def on_routed(self, candidate: Candidate, request: RouteRequest) -> None:
        return None

    def on_workers_changed(self, urls: Sequence[str]) -> None:
        self._ring.rebuild(urls)


def ring_candidates(ring: HashRing, candidates: Sequence[C]) -> dict[str, C]:
    """Candidates by URL, first placing on ``ring`` any the pool never announced (so none is unreachable)."""
    by_url = {c.url: c for c in candidates}
    if not by_url.keys() <= ring.urls:
        ring.rebuild(ring.urls | by_url.keys())
    return by_url
