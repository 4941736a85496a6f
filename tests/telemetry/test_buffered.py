"""Buffered counters and histograms: after a flush the instruments hold exactly what direct calls give."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from node.telemetry.buffered import BufferedCounter, BufferedHistogram, flush_all

BUCKETS = (0.001, 0.01, 0.1, 1.0, 10.0)
values = st.floats(min_value=0.0, max_value=100.0, allow_nan=False) | st.sampled_from(BUCKETS)


def _pair() -> tuple[CollectorRegistry, Counter, Histogram]:
    registry = CollectorRegistry()
    counter = Counter("c", "c", ["k"], registry=registry)
    histogram = Histogram("h", "h", ["k"], buckets=BUCKETS, registry=registry)
    return registry, counter, histogram


@given(st.lists(st.lists(values, max_size=20), max_size=5))
def test_flushed_instruments_equal_direct_calls(rounds: list[list[float]]) -> None:
    direct, d_counter, d_hist = _pair()
    buffered, b_counter, b_hist = _pair()
    dirty: list[BufferedCounter | BufferedHistogram] = []
    counter = BufferedCounter(b_counter.labels("a"), dirty)
    histogram = BufferedHistogram(b_hist.labels("a"), dirty)
    d_counter.labels("a")  # both sides export the series from the start
    d_hist.labels("a")
    for amounts in rounds:  # several flushes, each after a round of updates (a value on a bound included)
        for amount in amounts:
            d_counter.labels("a").inc(amount)
            d_hist.labels("a").observe(amount)
            counter.inc(amount)
            histogram.observe(amount)
        assert len(dirty) <= 2  # each instrument listed once, however many updates
        flush_all(dirty)
        assert not dirty
        assert _samples(buffered) == _samples(direct)


def _samples(registry: CollectorRegistry) -> list[str]:
    # Floating-point sums may differ in the last digits (a sum of sums); compare them rounded.
    lines = []
    for line in generate_latest(registry).decode().splitlines():
        if line.startswith("#") or "_created" in line:
            continue
        name, value = line.rsplit(" ", 1)
        lines.append(f"{name} {round(float(value), 6)}")
    return lines


def test_nothing_pending_is_lost_or_counted_twice() -> None:
    registry, counter_family, hist_family = _pair()
    dirty: list[BufferedCounter | BufferedHistogram] = []
    counter = BufferedCounter(counter_family.labels("a"), dirty)
    counter.inc(2)
    flush_all(dirty)
    flush_all(dirty)  # a second flush with nothing new adds nothing
    assert registry.get_sample_value("c_total", {"k": "a"}) == 2.0
    histogram = BufferedHistogram(hist_family.labels("a"), dirty)
    histogram.observe(0.01)  # on a bound: counted in that bucket, as prometheus-client does
    flush_all(dirty)
    assert registry.get_sample_value("h_bucket", {"k": "a", "le": "0.01"}) == 1.0
    assert registry.get_sample_value("h_bucket", {"k": "a", "le": "0.001"}) == 0.0
