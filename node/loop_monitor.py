"""Event-loop lag: how late a timer fires. A lagging loop means some CPU work is blocking it.

Every ``interval_s`` the monitor sleeps and measures how much later than asked it woke up; the lag goes to a
histogram (Prometheus, once ``export``-ed), the worst value ever is kept for introspection, and the worst of
the last ``RECENT_S`` for whoever must not blame others for our own slowness (worker health checks: a node
whose loop stalls cannot tell a slow worker from its own delay, Lifeguard's local health awareness).
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Histogram

# Buckets around the 2 ms budget a request's CPU work may block the loop for (issue: "no single request's CPU
# work blocks it for more than 2 ms").
LAG_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
DEFAULT_INTERVAL_S = 0.1  # 10 wake-ups a second: part of an idle node's floor
#: How far back ``recent_lag_s`` looks: longer than a health check's deadline (2 s by default), so a stall
#: during a check is still remembered when the check ends.
RECENT_S = 5.0


class LoopLagMonitor:
    def __init__(
        self, *, interval_s: float = DEFAULT_INTERVAL_S, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self._interval_s = interval_s
        self._clock = clock
        self._histogram: Histogram | None = None
        # (when measured, lag), lags strictly decreasing from the oldest: a sample followed by a later one at
        # least as large can never be a window's worst, so it is dropped. The worst of any recent window is
        # then its oldest entry, found in a few steps: every health check of every worker asks (64 workers:
        # 32 times a second), and scanning all RECENT_S / interval_s samples each time was an idle cost.
        self._recent: collections.deque[tuple[float, float]] = collections.deque()
        self.max_lag_s = 0.0

    def export(self, registry: CollectorRegistry) -> None:
        """Publish the lag histogram in ``registry`` (once)."""
        self._histogram = Histogram(
            "smg_node_event_loop_lag_seconds",
            "How late the event loop ran a timer (CPU work blocking the loop shows up here).",
            buckets=LAG_BUCKETS_S,
            registry=registry,
        )

    def observe(self, lag_s: float) -> None:
        now = self._clock()
        if self._histogram is not None:
            self._histogram.observe(lag_s)
        self.max_lag_s = max(self.max_lag_s, lag_s)
        recent = self._recent
        while recent and recent[-1][1] <= lag_s:
            recent.pop()
        recent.append((now, lag_s))
        self._forget(now)

    def recent_lag_s(self, within_s: float = RECENT_S) -> float:
        """The worst lag measured in the last ``within_s`` seconds (at most ``RECENT_S``; 0 when none)."""
        now = self._clock()
        self._forget(now)
        since = now - within_s
        for at, lag in self._recent:  # the first sample inside the window is its worst
            if at >= since:
                return lag
        return 0.0

    def _forget(self, now: float) -> None:
        while self._recent and self._recent[0][0] < now - RECENT_S:
            self._recent.popleft()

    async def run(self) -> None:
        while True:
            started = self._clock()
            await asyncio.sleep(self._interval_s)
            self.observe(max(0.0, self._clock() - started - self._interval_s))
