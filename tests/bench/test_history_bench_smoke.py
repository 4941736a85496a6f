"""The response-history benchmarks end to end, one tiny run each: bench.responses_bench (the real CLI, a real sim
worker, a real node) and bench.storage_bench (the stores alone, against the real Redis and Postgres).

The full runs (~3 min together) are what bench/RESULTS.md records; these smoke runs stand in for them in the
normal suite.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.storage.conftest import PG_PORT, REDIS_PORT, port_open

REPO = Path(__file__).resolve().parents[2]


def run_module(module: str, out_dir: Path, *args: str, timeout_s: float) -> tuple[str, dict[str, Any]]:
    cmd = [sys.executable, "-m", f"bench.{module}", "--out-dir", str(out_dir), *args]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout_s, check=False)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}"
    raw: dict[str, Any] = json.loads((out_dir / f"{module}-latest.json").read_text())
    assert list(out_dir.glob(f"{module}-*.md")), "the stamped table is kept next to the raw data"
    return done.stdout, raw


def test_responses_bench_smoke(tmp_path: Path) -> None:
    args = ("--backends", "memory", "--concurrency", "2", "--duration-s", "0.5", "--rounds", "1")
    stdout, raw = run_module("responses_bench", tmp_path, *args, "--max-output-tokens", "4", timeout_s=90)
    assert "| backend | stored resp/s |" in stdout and "| memory |" in stdout
    points = raw["points"]["memory"]
    for side in ("store=false", "store=true"):
        (point,) = points[side]
        assert point["requests"] >= 5 and point["errors"] == 0, point
        assert 0 < point["p50_ms"] <= point["p99_ms"]
        assert point["node_cpu_s"] > 0
        assert point["server_cpu_s"] == 0  # the memory store has no server
        assert point["other_cpu_s"] >= 0


def test_storage_bench_smoke(tmp_path: Path) -> None:
    backends = ["memory"] + [b for b, port in (("redis", REDIS_PORT), ("postgres", PG_PORT)) if port_open(port)]
    if len(backends) < 3:
        pytest.skip(f"redis and postgres must both listen on 127.0.0.1 (found {backends})")
    args = ("--backends", ",".join(backends), "--requests", "64", "--concurrency", "4", "--reps", "2")
    stdout, raw = run_module("storage_bench", tmp_path, *args, timeout_s=60)
    for backend in backends:
        assert f"| {backend} |" in stdout
        runs = [run for run in raw["runs"] if run["backend"] == backend]
        assert [run["repetition"] for run in runs] == [0, 1]
        for run in runs:
            assert run["puts"] == 64 and 0 < run["p50_ms"] <= run["p99_ms"], run
            assert run["server_cpu_s"] is not None, "the local server's process tree was found"
