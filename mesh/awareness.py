"""Lifeguard's local health awareness (LHA): a bounded score that slows our probing when we look unhealthy.

A node that misses acks *and* the nacks its relays promised, or that has to refute accusations, is more
likely slow itself than surrounded by failures. Scaling our probe interval and timeout by ``score + 1``
keeps a degraded node from flooding the cluster with false suspicions (Lifeguard, section 4.1).
"""

from __future__ import annotations


class Awareness:
    """Score in ``[0, max_multiplier - 1]``; 0 is healthy. ``max_multiplier = 1`` disables the mechanism."""

    __slots__ = ("_max", "score")

    def __init__(self, max_multiplier: int) -> None:
        if max_multiplier < 1:
            raise ValueError(f"max_multiplier: must be >= 1, got {max_multiplier}")
        self._max = max_multiplier
        self.score = 0

    def apply_delta(self, delta: int) -> None:
        """Add ``delta``, clamped to the bounds (so it saturates instead of winding up)."""
        self.score = min(max(self.score + delta, 0), self._max - 1)

    def scale(self, timeout_s: float) -> float:
        """``timeout_s`` stretched by the current score: at most ``max_multiplier`` times longer."""
        return timeout_s * (self.score + 1)
