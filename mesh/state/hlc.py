"""A hybrid logical clock (Kulkarni et al., 2014) for registry writes: wall-clock milliseconds plus a
logical counter, so every write is ordered after everything its writer has seen, and concurrent writes
are ordered by time (then by writer name), never by pycrdt's client ids.

Pure: the physical time comes in as ``now_s``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, order=True)
class Hlc:
    wall_ms: int
    logical: int

    @property
    def wall_s(self) -> float:
        return self.wall_ms / 1000.0


class HybridClock:
    """Not thread-safe: owned by one ClusterState."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last = Hlc(0, 0)

    @property
    def last(self) -> Hlc:
        return self._last

    def tick(self, now_s: float) -> Hlc:
        """A timestamp greater than every one issued or observed so far."""
        wall = int(now_s * 1000)
        last = self._last
        self._last = Hlc(wall, 0) if wall > last.wall_ms else Hlc(last.wall_ms, last.logical + 1)
        return self._last

    def observe(self, seen: Hlc) -> None:
        """Remember a remote timestamp, so our next ``tick`` is after it (even if our clock lags)."""
        self._last = max(self._last, seen)
