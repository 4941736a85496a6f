"""A cancellable timer heap on an injected clock: the core's notion of "later", with no asyncio inside.

The shell asks :meth:`Timers.next_deadline` when to wake up and calls :meth:`Timers.fire_due` with the
current time; the simulator does the same with virtual time.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable


class Timer:
    __slots__ = ("callback", "cancelled", "when")

    def __init__(self, when: float, callback: Callable[[float], None]) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Timers:
    __slots__ = ("_heap", "_serial")

    def __init__(self) -> None:
        # (when, serial, timer): the serial keeps equal deadlines in scheduling order.
        self._heap: list[tuple[float, int, Timer]] = []
        self._serial = 0

    def call_at(self, when: float, callback: Callable[[float], None]) -> Timer:
        """Run ``callback(now)`` at the first ``fire_due(now)`` with ``now >= when``."""
        self._serial += 1
        timer = Timer(when, callback)
        heapq.heappush(self._heap, (when, self._serial, timer))
        return timer

    def next_deadline(self) -> float | None:
        heap = self._heap
        while heap and heap[0][2].cancelled:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def fire_due(self, now: float) -> int:
        """Run every due timer in deadline order (including ones scheduled by callbacks); return the count."""
        fired = 0
        heap = self._heap
        while heap and heap[0][0] <= now:
            timer = heapq.heappop(heap)[2]
            if timer.cancelled:
                continue
            timer.cancelled = True
            timer.callback(now)
            fired += 1
        return fired

    def clear(self) -> None:
        for _, _, timer in self._heap:
            timer.cancelled = True
        self._heap.clear()
