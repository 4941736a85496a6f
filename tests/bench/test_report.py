"""Medians, ratios and target checks of the benchmark report."""

from __future__ import annotations

import dataclasses
import math

from bench.load import LoadResult, Sample
from bench.report import (
    NODE,
    SMG,
    CpuUse,
    Metrics,
    Point,
    PointRun,
    measure,
    percentile,
    ratio_table,
    summarize,
)


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50
    assert percentile(values, 99) == 99
    assert percentile([3.0], 99) == 3
    assert math.isnan(percentile([], 50))


def _metrics(req_s: float, cpu_ms: float, ttft_ms: float) -> Metrics:
    result = LoadResult(
        samples=tuple(Sample(ttft_ms / 1000, 0.01, 200, 20) for _ in range(10)),
        error_count=0,
        errors=(),
        wall_s=10 / req_s,
        loadgen_cpu_s=0.1,
        next_number=10,
    )
    cpu = CpuUse(gateway_s=cpu_ms * 10 / 1000, worker_s=0.01, driver_s=0.1, machine_busy_s=1.0)
    return dataclasses.replace(measure(result, 20, cpu, 2**20), req_s=req_s)


def test_measure_counts_cpu_per_request_and_token_mismatches() -> None:
    m = _metrics(req_s=100, cpu_ms=2.0, ttft_ms=3.0)
    assert m.requests == 10
    assert m.gateway_cpu_ms_per_req == 2.0
    assert m.ttft_p50_ms == 3.0
    assert m.wrong_token_counts == 0
    assert m.gateway_rss_mb == 1


def test_summary_takes_medians_over_repetitions() -> None:
    point = Point(200, 20, 1)
    runs = [PointRun(NODE, rep, point, _metrics(req, 1.0, 1.0), ()) for rep, req in enumerate((90, 100, 300))]
    assert summarize(runs)[(NODE, point)].req_s == 100


def test_ratio_table_checks_targets() -> None:
    point = Point(200, 20, 1)
    runs = [
        PointRun(NODE, 0, point, _metrics(req_s=95, cpu_ms=1.4, ttft_ms=1.3), ()),
        PointRun(SMG, 0, point, _metrics(req_s=100, cpu_ms=1.0, ttft_ms=1.0), ()),
    ]
    table = ratio_table(summarize(runs))
    assert "✅ CPU/req ≤ 1.5× at 200/20" in table
    assert "✅ throughput ≥ 0.9×" in table
    assert "✅ TTFT p50 at c1 ≤ +0.5 ms" in table
    runs[0] = PointRun(NODE, 0, point, _metrics(req_s=50, cpu_ms=2.0, ttft_ms=2.0), ())
    table = ratio_table(summarize(runs))
    assert "❌ CPU/req ≤ 1.5× at 200/20" in table
    assert "❌ throughput ≥ 0.9×" in table
    assert "❌ TTFT p50 at c1 ≤ +0.5 ms" in table
