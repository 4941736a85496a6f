"""Bucket routing by prompt length, for prefill pools: short and long prompts go to different workers, so a
long prefill never queues in front of many short ones.

``boundaries_tokens`` (ascending) split prompt lengths into ``len + 1`` buckets; a prompt exactly at a
boundary falls in the bucket above it. Buckets are spread over the healthy workers in URL order: with at
least as many workers as buckets each bucket gets a contiguous group (the least loaded of the group is
chosen), with fewer, neighbouring buckets share a worker. Without boundaries there is one bucket per worker
over 0..``AUTO_MAX_TOKENS`` (SMG's starting split), the last one open-ended. When the pool is imbalanced
(SMG's absolute and relative thresholds, as in cache_aware) the least-loaded worker is chosen instead.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

from node.routing.load import DispatchCredit, argmin, is_imbalanced, request_loads
from node.routing.policy import C, Candidate, RouteRequest

# SMG's initial bucket span (``Bucket::l_max``): boundaries evenly spaced below it when none are configured.
AUTO_MAX_TOKENS = 4096


def auto_boundaries(workers: int) -> tuple[int, ...]:
    return tuple(AUTO_MAX_TOKENS * k // workers for k in range(1, workers))


def bucket_group(bucket: int, buckets: int, workers: int) -> range:
    """The workers (indices in URL order) serving ``bucket``: never empty, and every worker serves one."""
    low = bucket * workers // buckets
    return range(low, max(low + 1, (bucket + 1) * workers // buckets))


class Bucket:
    name = "bucket"

    def __init__(
        self,
        *,
        boundaries_tokens: tuple[int, ...],
        balance_abs_threshold: int,
        balance_rel_threshold: float,
        load_stale_after_s: float,
    ) -> None:
        self._boundaries = boundaries_tokens
        self._abs = balance_abs_threshold
        self._rel = balance_rel_threshold
        self._stale_after_s = load_stale_after_s
        self._credit = DispatchCredit()

    def select(self, candidates: Sequence[C], request: RouteRequest) -> C:
        workers = sorted(candidates, key=lambda c: c.url)
        loads = request_loads(workers, self._credit, request.now_s, self._stale_after_s)
        if len(workers) > 1 and is_imbalanced(loads, self._abs, self._rel):
            return workers[argmin(loads)]
        boundaries = self._boundaries or auto_boundaries(len(workers))
        bucket = bisect_right(boundaries, len(request.prompt_ids))
        group = bucket_group(bucket, len(boundaries) + 1, len(workers))
        return workers[min(group, key=loads.__getitem__)]

    def on_routed(self, candidate: Candidate, request: RouteRequest) -> None:
        self._credit.record(candidate.url, request.now_s, len(request.prompt_ids))

    def on_workers_changed(self, urls: Sequence[str]) -> None:
        self._credit.retain(urls)
