"""Manual (sticky) routing: each routing key stays on the worker it was first sent to.

Unlike consistent hashing, no key moves when workers join; a key moves only when its worker is not among the
healthy candidates. It then goes to the least-loaded healthy worker (ties broken at random), which becomes
its worker from then on; the previous one is remembered as a fallback (``MAX_WORKERS_PER_KEY``), so a
session returns to a worker that may still hold its context rather than to a third one. Keys are forgotten
after ``ttl_s`` unused, and beyond ``max_entries`` the least recently used first. A request without a key
goes to a random worker.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from node.routing.load import DispatchCredit, request_loads
from node.routing.policy import C, Candidate, RouteRequest

# Workers remembered per key: the current one and one fallback (SMG keeps two as well).
MAX_WORKERS_PER_KEY = 2


@dataclass(frozen=True, slots=True)
class _Entry:
    urls: tuple[str, ...]  # most recent first
    last_used_s: float


class Manual:
    name = "manual"

    def __init__(self, rng: random.Random, *, ttl_s: float, max_entries: int, load_stale_after_s: float) -> None:
        self._rng = rng
        self._ttl_s = ttl_s
        self._max_entries = max_entries
        self._stale_after_s = load_stale_after_s
        self._keys: OrderedDict[str, _Entry] = OrderedDict()  # least recently used first
        self._credit = DispatchCredit()

    def __len__(self) -> int:
        return len(self._keys)

    def assigned(self, key: str) -> tuple[str, ...]:
        """The workers remembered for ``key``, current first (empty when it is not remembered)."""
        entry = self._keys.get(key)
        return () if entry is None else entry.urls

    def select(self, candidates: Sequence[C], request: RouteRequest) -> C:
        key = request.routing_key
        if not key:
            return candidates[self._rng.randrange(len(candidates))]
        entry = self._keys.get(key)
        if entry is not None and request.now_s - entry.last_used_s <= self._ttl_s:
            by_url = {c.url: c for c in candidates}
            for url in entry.urls:
                if url in by_url:
                    return by_url[url]
        loads = request_loads(candidates, self._credit, request.now_s, self._stale_after_s)
        low = min(loads)
        return self._rng.choice([c for c, load in zip(candidates, loads, strict=True) if load == low])

    def on_routed(self, candidate: Candidate, request: RouteRequest) -> None:
        self._credit.record(candidate.url, request.now_s, len(request.prompt_ids))
        key = request.routing_key
        if not key:
            return
        now = request.now_s
        old = self._keys.pop(key, None)
        previous = () if old is None or now - old.last_used_s > self._ttl_s else old.urls
        urls = (candidate.url, *(u for u in previous if u != candidate.url))[:MAX_WORKERS_PER_KEY]
        self._keys[key] = _Entry(urls, now)
        self._evict(now)

    def on_workers_changed(self, urls: Sequence[str]) -> None:
        present = set(urls)
        for key, entry in list(self._keys.items()):
            kept = tuple(u for u in entry.urls if u in present)
            if not kept:
                del self._keys[key]
            elif kept != entry.urls:
                self._keys[key] = _Entry(kept, entry.last_used_s)
        self._credit.retain(urls)

    def _evict(self, now_s: float) -> None:
        keys = self._keys
        while len(keys) > self._max_entries:
            keys.popitem(last=False)
        while keys:
            oldest = next(iter(keys.values()))
            if now_s - oldest.last_used_s <= self._ttl_s:
                break
            keys.popitem(last=False)
