"""Cache-aware routing (SMG's algorithm): send a prompt where its prefix is already cached, unless the pool is
imbalanced.

1. Imbalanced (max - min load > ``balance_abs_threshold`` and max > ``balance_rel_threshold`` * min): the
   least-loaded worker.
2. Otherwise the worker holding the longest leading part of the prompt, if that part is at least
   ``cache_threshold`` of the prompt (ties: lower load, then less cached).
3. Otherwise the worker with the least cached (the most room), ties by load: a new prefix goes where it
   displaces least.

What a worker holds is exact when it publishes KV events (``KvIndex``, the engine's own blocks) and
otherwise guessed from what this gateway sent it (``ApproxTree``, fed by ``on_routed``) and, in a mesh, what
the other nodes sent it (``AffinityHints``). Both are counted in tokens, so workers of either kind compare.
Load is in requests (``load.request_loads``).
"""

from __future__ import annotations

from collections.abc import Sequence

from node.routing.affinity import AffinityHints
from node.routing.approx_tree import ApproxTree
from node.routing.block_hashes import BlockHashes
from node.routing.kv_index import KvIndex
from node.routing.load import DispatchCredit, argmin, is_imbalanced, request_loads
from node.routing.policy import C, Candidate, RouteRequest


class CacheAware:
    name = "cache_aware"

    def __init__(
        self,
        *,
        cache_threshold: float,
        balance_abs_threshold: int,
        balance_rel_threshold: float,
        page_size_tokens: int,
        tree_max_pages: int,
        load_stale_after_s: float,
        kv_index: KvIndex | None = None,
        hints: AffinityHints | None = None,
    ) -> None:
        self._threshold = cache_threshold
        self._abs = balance_abs_threshold
        self._rel = balance_rel_threshold
        self._stale_after_s = load_stale_after_s
        self._tree = ApproxTree(page_size_tokens, tree_max_pages)
        self._kv = kv_index
        self._hints = hints
        self._credit = DispatchCredit()
        # select and on_routed see the same request in turn: hash its pages once.
        self._last: tuple[RouteRequest, BlockHashes] | None = None

    @property
    def tree(self) -> ApproxTree:
        return self._tree

    def select(self, candidates: Sequence[C], request: RouteRequest) -> C:
        if len(candidates) == 1:
            return candidates[0]
        loads = request_loads(candidates, self._credit, request.now_s, self._stale_after_s)
        if is_imbalanced(loads, self._abs, self._rel):
            return candidates[argmin(loads)]
        cached, matched = self.cache_view(candidates, request)
        longest = max(matched)
        if longest > 0 and longest >= self._threshold * len(request.prompt_ids):
            best = [i for i, m in enumerate(matched) if m == longest]
            return candidates[min(best, key=lambda i: (loads[i], cached[i]))]
        return candidates[min(range(len(candidates)), key=lambda i: (cached[i], loads[i]))]

    def cache_view(self, candidates: Sequence[Candidate], request: RouteRequest) -> tuple[list[int], list[int]]:
        """(tokens cached, leading prompt tokens cached) per candidate, from KV events where published."""
        hashes = self._hashes(request)
        tree, page = self._tree, self._tree.page_size
        tree_depths = tree.match(hashes)
        if self._hints is not None:  # other nodes' decisions count like our own
            for url, tokens in self._hints.match(hashes).items():
                tree_depths[url] = max(tree_depths.get(url, 0), tokens // page)
        kv = self._kv
        size = kv.block_size if kv is not None else None
        if kv is None or size is None:
            cached = [tree.pages_of(c.url) * page for c in candidates]
            return cached, [tree_depths.get(c.url, 0) * page for c in candidates]
        kv_depths = kv.match(hashes)
        cached, matched = [], []
        for c, blocks in zip(candidates, kv.holdings([c.url for c in candidates]), strict=True):
            if blocks is not None:
                cached.append(blocks * size)
                matched.append(kv_depths.get(c.url, 0) * size)
            else:
                cached.append(tree.pages_of(c.url) * page)
                matched.append(tree_depths.get(c.url, 0) * page)
        return cached, matched

    def on_routed(self, candidate: Candidate, request: RouteRequest) -> None:
        self._credit.record(candidate.url, request.now_s, len(request.prompt_ids))
        # A worker that publishes KV events tells us what it caches; guessing for it would only cost time.
        if self._kv is None or self._kv.block_size is None or not self._kv.knows(candidate.url):
            self._tree.insert(self._hashes(request), candidate.url)
            if self._hints is not None:
                self._hints.learn(self._hashes(request), candidate.url)

    def on_workers_changed(self, urls: Sequence[str]) -> None:
        self._tree.retain(urls)
        self._credit.retain(urls)
        # Hints are not pruned here: several policies (per role) share them, a hint naming a removed worker
        # matches no candidate, and every hint ages out.

    def _hashes(self, request: RouteRequest) -> BlockHashes:
        if self._last is not None and self._last[0] is request:
            return self._last[1]
        hashes = BlockHashes(request.prompt_ids, self._tree.page_size)
        self._last = (request, hashes)
        return hashes
