"""Turn per-repetition point runs into medians, smg-node/SMG ratios, target checks and markdown."""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import math
import os
import platform
import statistics
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, TypeVar

from bench.load import LoadResult

REPO_DIR = Path(__file__).resolve().parent.parent

NODE = "smg-node"
SMG = "SMG"


@dataclass(frozen=True, slots=True, order=True)
class Point:
    prompt_tokens: int
    output_tokens: int
    concurrency: int

    def label(self) -> str:
        return f"{self.prompt_tokens}/{self.output_tokens} c{self.concurrency}"


@dataclass(frozen=True, slots=True)
class Metrics:
    """One gateway at one point: from one repetition, or the per-field median of several."""

    requests: float
    errors: float
    wrong_token_counts: float  # requests whose completion_tokens differed from max_tokens
    prompt_tokens: float  # mean usage.prompt_tokens
    req_s: float
    out_tok_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    latency_p50_ms: float
    latency_p99_ms: float
    gateway_cpu_ms_per_req: float
    worker_cpu_ms_per_req: float
    loadgen_cpu_pct: float  # the load generator's CPU over the point, % of one core
    other_cpu_pct: float  # CPU of every other process on the machine over the point, % of one core
    gateway_rss_mb: float


@dataclass(frozen=True, slots=True)
class PointRun:
    gateway: str
    repetition: int
    point: Point
    metrics: Metrics
    errors: tuple[str, ...]


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True, slots=True)
class CpuUse:
    """CPU seconds spent during one point, by whom."""

    gateway_s: float
    worker_s: float
    driver_s: float  # this process: the load generator and the sampling around it
    machine_busy_s: float  # all cores, all processes

    @property
    def other_s(self) -> float:
        return max(0.0, self.machine_busy_s - self.gateway_s - self.worker_s - self.driver_s)


def measure(result: LoadResult, max_tokens: int, cpu: CpuUse, gateway_rss_bytes: int) -> Metrics:
    samples = result.samples
    done = len(samples)
    per_req = 1000.0 / done if done else math.nan
    wall = result.wall_s
    return Metrics(
        requests=done,
        errors=result.error_count,
        wrong_token_counts=sum(1 for s in samples if s.completion_tokens != max_tokens),
        prompt_tokens=statistics.fmean(s.prompt_tokens for s in samples) if samples else math.nan,
        req_s=done / wall,
        out_tok_s=sum(s.completion_tokens for s in samples) / wall,
        ttft_p50_ms=percentile([s.ttft_s * 1000 for s in samples], 50),
        ttft_p99_ms=percentile([s.ttft_s * 1000 for s in samples], 99),
        latency_p50_ms=percentile([s.latency_s * 1000 for s in samples], 50),
        latency_p99_ms=percentile([s.latency_s * 1000 for s in samples], 99),
        gateway_cpu_ms_per_req=cpu.gateway_s * per_req,
        worker_cpu_ms_per_req=cpu.worker_s * per_req,
        loadgen_cpu_pct=100.0 * result.loadgen_cpu_s / wall,
        other_cpu_pct=100.0 * cpu.other_s / wall,
        gateway_rss_mb=gateway_rss_bytes / 2**20,
    )


D = TypeVar("D")


def median(values: Iterable[float]) -> float:
    """The median, NaNs left out (NaN for none)."""
    kept = [v for v in values if not math.isnan(v)]
    return statistics.median(kept) if kept else math.nan


def median_fields(cls: type[D], items: Iterable[D]) -> D:
    """The field-by-field median of dataclass instances whose fields are all numbers (NaNs left out)."""
    rows = list(items)
    values: dict[str, Any] = {}
    for f in fields(cls):  # type: ignore[arg-type]
        values[f.name] = median(getattr(row, f.name) for row in rows)
    return cls(**values)


def median_metrics(runs: Iterable[Metrics]) -> Metrics:
    return median_fields(Metrics, runs)


def summarize(runs: Sequence[PointRun]) -> dict[tuple[str, Point], Metrics]:
    groups: dict[tuple[str, Point], list[Metrics]] = {}
    for run in runs:
        groups.setdefault((run.gateway, run.point), []).append(run.metrics)
    return {key: median_metrics(group) for key, group in groups.items()}


def fmt(value: float, digits: int = 1) -> str:
    """A table cell: thousands separators, ``digits`` decimals, an em dash for NaN."""
    if math.isnan(value):
        return "—"
    return f"{value:,.{digits}f}"


def ratio(a: float, b: float) -> float:
    """a / b, NaN when either is NaN or b is 0."""
    if math.isnan(a) or math.isnan(b) or b == 0:
        return math.nan
    return a / b


def metrics_table(summary: dict[tuple[str, Point], Metrics], gateways: Sequence[str]) -> str:
    head = (
        "| prompt/out | conc | gateway | req/s | out tok/s | TTFT p50 ms | TTFT p99 ms | lat p50 ms "
        "| lat p99 ms | gw CPU ms/req | worker CPU ms/req | loadgen CPU % | other CPU % | gw RSS MB "
        "| ok req | err | bad tok |"
    )
    lines = [head, "|" + "---|" * 17]
    for point in sorted({p for _, p in summary}):
        for gateway in gateways:
            m = summary.get((gateway, point))
            if m is None:
                continue
            cells = [
                f"{point.prompt_tokens}/{point.output_tokens}",
                str(point.concurrency),
                gateway,
                fmt(m.req_s),
                fmt(m.out_tok_s, 0),
                fmt(m.ttft_p50_ms, 2),
                fmt(m.ttft_p99_ms, 2),
                fmt(m.latency_p50_ms, 2),
                fmt(m.latency_p99_ms, 2),
                fmt(m.gateway_cpu_ms_per_req, 2),
                fmt(m.worker_cpu_ms_per_req, 2),
                fmt(m.loadgen_cpu_pct, 0),
                fmt(m.other_cpu_pct, 0),
                fmt(m.gateway_rss_mb, 0),
                fmt(m.requests, 0),
                fmt(m.errors, 0),
                fmt(m.wrong_token_counts, 0),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class Target:
    """A bound on smg-node relative to SMG at some points (the next issue's goals)."""

    name: str
    prompt_tokens: int | None  # None: every point
    output_tokens: int | None
    concurrency: int | None
    metric: str  # "cpu", "throughput" or "ttft_delta"
    bound: float

    def applies(self, point: Point) -> bool:
        return (
            (self.prompt_tokens is None or self.prompt_tokens == point.prompt_tokens)
            and (self.output_tokens is None or self.output_tokens == point.output_tokens)
            and (self.concurrency is None or self.concurrency == point.concurrency)
        )


TARGETS = (
    Target("CPU/req ≤ 1.2× at 7,800/20", 7800, 20, None, "cpu", 1.2),
    Target("CPU/req ≤ 1.5× at 200/20", 200, 20, None, "cpu", 1.5),
    Target("CPU/req ≤ 2× at 200/200", 200, 200, None, "cpu", 2.0),
    Target("throughput ≥ 0.9×", None, None, None, "throughput", 0.9),
    Target("TTFT p50 at c1 ≤ +0.5 ms", None, None, 1, "ttft_delta", 0.5),
)


def _check(target: Target, node: Metrics, smg: Metrics) -> tuple[float, bool]:
    if target.metric == "cpu":
        value = ratio(node.gateway_cpu_ms_per_req, smg.gateway_cpu_ms_per_req)
        return value, value <= target.bound
    if target.metric == "throughput":
        value = ratio(node.out_tok_s, smg.out_tok_s)
        return value, value >= target.bound
    value = node.ttft_p50_ms - smg.ttft_p50_ms
    return value, value <= target.bound


def ratio_table(summary: dict[tuple[str, Point], Metrics]) -> str:
    head = (
        "| prompt/out | conc | req/s × | out tok/s × | TTFT p50 × | TTFT p50 Δ ms | TTFT p99 × | lat p50 × "
        "| lat p99 × | gw CPU/req × | targets |"
    )
    lines = [head, "|" + "---|" * 11]
    for point in sorted({p for _, p in summary}):
        node, smg = summary.get((NODE, point)), summary.get((SMG, point))
        if node is None or smg is None:
            continue
        verdicts = []
        for target in TARGETS:
            if target.applies(point):
                _, ok = _check(target, node, smg)
                verdicts.append(("✅ " if ok else "❌ ") + target.name)
        lines.append(
            f"| {point.prompt_tokens}/{point.output_tokens} | {point.concurrency} "
            f"| {fmt(ratio(node.req_s, smg.req_s), 2)} | {fmt(ratio(node.out_tok_s, smg.out_tok_s), 2)} "
            f"| {fmt(ratio(node.ttft_p50_ms, smg.ttft_p50_ms), 2)} "
            f"| {fmt(node.ttft_p50_ms - smg.ttft_p50_ms, 2)} "
            f"| {fmt(ratio(node.ttft_p99_ms, smg.ttft_p99_ms), 2)} "
            f"| {fmt(ratio(node.latency_p50_ms, smg.latency_p50_ms), 2)} "
            f"| {fmt(ratio(node.latency_p99_ms, smg.latency_p99_ms), 2)} "
            f"| {fmt(ratio(node.gateway_cpu_ms_per_req, smg.gateway_cpu_ms_per_req), 2)} "
            f"| {'<br>'.join(verdicts)} |"
        )
    return "\n".join(lines)


def json_ready(fields: Mapping[str, object]) -> dict[str, object]:
    """``fields`` with NaN values as None (null: JSON has no NaN)."""
    return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in fields.items()}


def run_record(run: PointRun) -> dict[str, object]:
    """A JSON-ready record of one run."""
    return {
        "gateway": run.gateway,
        "repetition": run.repetition,
        "point": asdict(run.point),
        "metrics": json_ready(asdict(run.metrics)),
        "errors": list(run.errors),
    }


# --- the environment a run was measured in, and RESULTS.md blocks ---


def package_version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def git_revision() -> str:
    try:
        rev = subprocess.run(
            ["git", "-C", str(REPO_DIR), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()  # fmt: skip
        dirty = subprocess.run(
            ["git", "-C", str(REPO_DIR), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return rev + (" (with uncommitted changes)" if dirty else "")


def versions_line() -> str:
    return (
        f"smg-node {package_version('smg-node')} (git {git_revision()}), SMG {package_version('smg')}, "
        f"Python {platform.python_version()}, aiohttp {package_version('aiohttp')}, "
        f"tokenizers {package_version('tokenizers')}"
    )


def machine_line() -> str:
    return f"{os.cpu_count()} cores ({cpu_model()}), Linux {platform.release()}"


def write_block(path: Path, begin: str, end: str, block: str, heading: str) -> None:
    """Replace the text between the ``begin`` and ``end`` marker lines of ``path`` with ``block`` (prose
    outside the markers is kept). Without the markers, append ``heading`` and the marked block; without the
    file, create it."""
    generated = f"{begin}\n{block}{end}"
    if path.exists():
        text = path.read_text("utf-8")
        if begin in text and end in text:
            head, rest = text.split(begin, 1)
            tail = rest.split(end, 1)[1]
            path.write_text(head + generated + tail, "utf-8")
            return
        path.write_text(text.rstrip("\n") + f"\n\n{heading}\n\n{generated}\n", "utf-8")
        return
    path.write_text(f"{heading}\n\n{generated}\n", "utf-8")


def save_outputs(out_dir: Path, name: str, block: str, raw_json: str) -> None:
    """Keep a run's table (``NAME-STAMP.md``) and raw data (``NAME-STAMP.json``, also ``NAME-latest.json``)."""
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    (out_dir / f"{name}-{stamp}.md").write_text(block, "utf-8")
    (out_dir / f"{name}-{stamp}.json").write_text(raw_json, "utf-8")
    (out_dir / f"{name}-latest.json").write_text(raw_json, "utf-8")
