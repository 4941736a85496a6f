"""Power of two choices: two distinct random healthy workers, the less loaded one wins.

Load is the engine's reported running + waiting requests plus what this gateway sent the worker since that
report was sampled (``DispatchCredit``), or the gateway's in-flight count when either of the two has no fresh
report. Random pairs keep a stale view from herding every request onto one worker; the credit keeps a burst
between two polls from piling onto the worker that looked idlest.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from node.routing.load import DispatchCredit, request_loads
from node.routing.policy import C, Candidate, RouteRequest


class PowerOfTwo:
    name = "power_of_two"

    def __init__(self, rng: random.Random, *, load_stale_after_s: float) -> None:
        self._rng = rng
        self._stale_after_s = load_stale_after_s
        self._credit = DispatchCredit()

    def select(self, candidates: Sequence[C], request: RouteRequest) -> C:
        n = len(candidates)
        if n == 1:
            return candidates[0]
        first = self._rng.randrange(n)
        second = (first + 1 + self._rng.randrange(n - 1)) % n
        pair = (candidates[first], candidates[second])
        loads = request_loads(pair, self._credit, request.now_s, self._stale_after_s)
        return pair[0] if loads[0] <= loads[1] else pair[1]

    def on_routed(self, candidate: Candidate, request: RouteRequest) -> None:
        self._credit.record(candidate.url, request.now_s, len(request.prompt_ids))

    def on_workers_changed(self, urls: Sequence[str]) -> None:
        self._credit.retain(urls)
