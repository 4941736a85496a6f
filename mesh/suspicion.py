"""Lifeguard's dynamic suspicion timeout (memberlist's suspicion.go, as pure functions and a value).

A suspicion starts at the maximum timeout and shrinks toward the minimum as independent members confirm
it, on a log scale: with ``k`` expected confirmations, the ``n``-th brings the timeout to
``max - log(n + 1) / log(k + 1) * (max - min)``. A member falsely accused by one slow node therefore has
``max`` (6x the plain-SWIM timeout by default) to refute, while a real failure, which every prober sees,
is declared after about ``min``.
"""

from __future__ import annotations

import math


def suspicion_timeout(suspicion_mult: int, n: int, probe_interval_s: float) -> float:
    """The minimum suspicion timeout: ``mult * max(1, log10(n)) * probe_interval`` (SWIM's scaling)."""
    node_scale = max(1.0, math.log10(max(1.0, float(n))))
    return suspicion_mult * node_scale * probe_interval_s


def remaining_suspicion_time(n: int, k: int, elapsed_s: float, min_s: float, max_s: float) -> float:
    """Time left before a suspicion with ``n`` of ``k`` confirmations expires; may be negative (fire now)."""
    if k < 1:
        return min_s - elapsed_s
    frac = math.log(n + 1.0) / math.log(k + 1.0)
    timeout = max(min_s, max_s - frac * (max_s - min_s))
    return timeout - elapsed_s


class Suspicion:
    """One member's suspicion: when it started, and who independently confirmed it.

    The first accuser is recorded but not counted (our own accusation may be gossiped back to us).
    """

    __slots__ = ("_accusers", "confirmations", "k", "max_s", "min_s", "start")

    def __init__(self, accuser: str, k: int, min_s: float, max_s: float, start: float) -> None:
        self.k = k
        self.min_s = min_s
        self.max_s = max_s
        self.start = start
        self.confirmations = 0
        self._accusers = {accuser}

    def deadline(self) -> float:
        """Absolute time at which the member is declared dead, given confirmations so far."""
        if self.k < 1:
            return self.start + self.min_s
        return self.start + remaining_suspicion_time(self.confirmations, self.k, 0.0, self.min_s, self.max_s)

    def confirm(self, accuser: str) -> bool:
        """Count a new independent accuser. False for a repeat accuser or once ``k`` is reached."""
        if self.confirmations >= self.k or accuser in self._accusers:
            return False
        self._accusers.add(accuser)
        self.confirmations += 1
        return True
