"""Least expected wait: the worker whose queue drains soonest, steering clear of a nearly full KV cache.

    score = (queued_tokens + sent_tokens + running_tokens) / throughput + kv_pressure_weight_s * k / (1 - k)

``queued_tokens`` is the engine's waiting prompt tokens not served from cache (or ``waiting *
mean_prefill_tokens`` when it cannot tell); ``sent_tokens`` the prompt tokens this gateway sent since the
report was sampled and still has open there (so a burst water-fills instead of landing on one worker, and a
report that stops being refreshed does not turn into a total of every dispatch since); ``running_tokens``
the output the engine's running requests still have to generate, ``running * mean_decode_tokens / 2`` (a
running request is halfway through its answer on average: engines do not report lengths). ``throughput`` is
the engine's generation rate (or ``default_throughput_tps`` when it reports none), ``k`` the KV-cache
utilisation. The second term is the M/M/1 occupancy barrier: convex, diverging at a full cache, where
engines start preempting. Both terms are seconds. A worker without a fresh report is scored by its in-flight
requests, each a mean prompt and half a mean answer, at the pool's mean reported rate; when no worker
reports, the fewest in-flight requests wins.
"""

from __future__ import annotations

from collections.abc import Sequence

from node.routing.load import DispatchCredit, argmin, fresh_load
from node.routing.policy import C, Candidate, LoadView, RouteRequest

# Utilisation is clamped below 1 so a full cache scores large but finite.
MAX_KV_UTILISATION = 0.999


class LeastLoad:
    name = "least_load"

    def __init__(
        self,
        *,
        kv_pressure_weight_s: float,
        default_throughput_tps: float,
        mean_prefill_tokens: int,
        mean_decode_tokens: int,
        load_stale_after_s: float,
    ) -> None:
        self._kv_weight_s = kv_pressure_weight_s
        self._default_tps = default_throughput_tps
        self._mean_prefill = mean_prefill_tokens
        self._remaining_decode = mean_decode_tokens / 2
        self._stale_after_s = load_stale_after_s
        self._credit = DispatchCredit()

    def select(self, candidates: Sequence[C], request: RouteRequest) -> C:
        if len(candidates) == 1:
            return candidates[0]
        return candidates[argmin(self.scores(candidates, request.now_s))]

    def scores(self, candidates: Sequence[Candidate], now_s: float) -> list[float]:
        """Each candidate's expected wait in seconds (in requests when no candidate reports)."""
        views = [fresh_load(c, now_s, self._stale_after_s) for c in candidates]
        rates = [v.gen_throughput for v in views if v is not None and v.gen_throughput > 0]
        if all(v is None for v in views):
            return [float(c.in_flight) for c in candidates]
        nominal_tps = sum(rates) / len(rates) if rates else self._default_tps
        return [
            self._score(c, v)
            if v is not None
            else c.in_flight * (self._mean_prefill + self._remaining_decode) / nominal_tps
            for c, v in zip(candidates, views, strict=True)
        ]

    def _score(self, candidate: Candidate, view: LoadView) -> float:
        queued = view.waiting_uncached_tokens
        if queued is None:
            queued = view.waiting * self._mean_prefill
        _, sent_tokens = self._credit.open_since(candidate.url, view.updated_at, candidate.in_flight)
        running_tokens = view.running * self._remaining_decode
        tps = view.gen_throughput if view.gen_throughput > 0 else self._default_tps
        k = min(max(view.token_usage, 0.0), MAX_KV_UTILISATION)
        return (queued + sent_tokens + running_tokens) / tps + self._kv_weight_s * k / (1.0 - k)

    def on_routed(self, candidate: Candidate, request: RouteRequest) -> None:
        tokens = len(request.prompt_ids) or self._mean_prefill
        self._credit.record(candidate.url, request.now_s, tokens)

    def on_workers_changed(self, urls: Sequence[str]) -> None:
        self._credit.retain(urls)
