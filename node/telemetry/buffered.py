"""Per-request counter and histogram updates kept in plain Python numbers and applied to prometheus-client's
instruments in one go (``flush``), at scrape time and every snapshot interval.

Why: with ``serve --processes N`` every ``inc``/``observe`` of prometheus-client takes a lock and writes an
mmap file (3-6 us each; a request makes about fifteen of them), and a histogram's ``observe`` walks its buckets
in Python. Here an update is an addition (a histogram's bucket is found by ``bisect``, in C) and the instruments
see the sums. Invariant: after ``flush`` the instruments hold exactly what direct calls would have made them
hold; between flushes the pending amounts are this process's only (a sibling's scrape sees them within one
snapshot interval, ``node.telemetry.multiproc.SNAPSHOT_INTERVAL_S``).
"""

from __future__ import annotations

from bisect import bisect_left

from prometheus_client import Counter, Histogram


class BufferedCounter:
    """A labelled Counter child's pending increments."""

    __slots__ = ("_child", "_dirty", "_pending", "_sink")

    def __init__(self, child: Counter, sink: list[BufferedCounter | BufferedHistogram]) -> None:
        self._child = child
        self._pending = 0.0
        self._dirty = False  # in the sink: each instrument is listed once, so the sink is bounded
        self._sink = sink  # the owner's dirty list

    def inc(self, amount: float = 1.0) -> None:
        if not self._dirty:
            self._dirty = True
            self._sink.append(self)
        self._pending += amount

    def flush(self) -> None:
        pending, self._pending, self._dirty = self._pending, 0.0, False
        if pending:
            self._child.inc(pending)


class BufferedHistogram:
    """A labelled Histogram child's pending observations: a count per bucket and their sum."""

    __slots__ = ("_bounds", "_child", "_counts", "_dirty", "_sink", "_sum")

    def __init__(self, child: Histogram, sink: list[BufferedCounter | BufferedHistogram]) -> None:
        self._child = child
        # The child's upper bounds, +Inf last: its observe() counts a value in the first bound >= it, which
        # is bisect_left's answer.
        self._bounds: tuple[float, ...] = tuple(child._upper_bounds)
        self._counts = [0] * len(self._bounds)
        self._sum = 0.0
        self._dirty = False
        self._sink = sink

    def observe(self, amount: float) -> None:
        if not self._dirty:
            self._dirty = True
            self._sink.append(self)
        self._counts[bisect_left(self._bounds, amount)] += 1
        self._sum += amount

    def flush(self) -> None:
        if not self._dirty:
            return
        self._dirty = False
        child = self._child
        # prometheus-client keeps one value per bucket (made cumulative when collected) and their sum: the
        # same attributes its own observe() increments.
        child._sum.inc(self._sum)
        for value, count in zip(child._buckets, self._counts, strict=True):
            if count:
                value.inc(count)
        self._sum = 0.0
        self._counts = [0] * len(self._bounds)


def flush_all(dirty: list[BufferedCounter | BufferedHistogram]) -> None:
    """Apply and clear every pending update in ``dirty`` (the instruments' shared dirty list)."""
    pending = dirty.copy()
    dirty.clear()
    for instrument in pending:
        instrument.flush()
