"""The gateway benchmark end to end: the real CLI, a real sim worker, real gateways, one tiny point.

The smoke runs stand in for the full matrix in the normal suite; the full run (~10 min) is `slow`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
PROMPT_TOKENS = 200
OUTPUT_TOKENS = 8
CONCURRENCY = 2


def run_bench(out_dir: Path, *args: str, timeout_s: float) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench.gateway_bench", "--out-dir", str(out_dir), *args]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout_s, check=False)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}"
    raw: dict[str, Any] = json.loads((out_dir / "gateway_bench-latest.json").read_text())
    assert "| prompt/out |" in done.stdout
    return raw


def run_tiny_point(out_dir: Path, gateways: str) -> dict[str, Any]:
    return run_bench(
        out_dir,
        "--gateways", gateways,
        "--prompts", str(PROMPT_TOKENS),
        "--outputs", str(OUTPUT_TOKENS),
        "--concurrency", str(CONCURRENCY),
        "--reps", "1",
        "--duration-s", "1",
        "--warmup-s", "0.3",
        timeout_s=60,
    )  # fmt: skip


def assert_sane(raw: dict[str, Any], gateway: str) -> None:
    assert raw["failures"] == []
    (run,) = [run for run in raw["runs"] if run["gateway"] == gateway]
    metrics = run["metrics"]
    assert run["point"] == {
        "prompt_tokens": PROMPT_TOKENS,
        "output_tokens": OUTPUT_TOKENS,
        "concurrency": CONCURRENCY,
    }
    assert metrics["requests"] >= 5, metrics
    assert metrics["errors"] == 0, run["errors"]
    assert metrics["wrong_token_counts"] == 0, "completion_tokens differed from max_tokens"
    assert PROMPT_TOKENS - 15 <= metrics["prompt_tokens"] <= PROMPT_TOKENS + 5, metrics
    assert metrics["req_s"] > 0
    assert metrics["out_tok_s"] == pytest.approx(metrics["req_s"] * OUTPUT_TOKENS)
    assert 0 < metrics["ttft_p50_ms"] <= metrics["latency_p50_ms"]
    assert metrics["ttft_p50_ms"] <= metrics["ttft_p99_ms"]
    assert metrics["gateway_cpu_ms_per_req"] > 0
    assert metrics["worker_cpu_ms_per_req"] > 0
    assert metrics["gateway_rss_mb"] > 0


def test_smoke_smg_node(tmp_path: Path) -> None:
    raw = run_tiny_point(tmp_path, "smg-node")
    assert_sane(raw, "smg-node")


@pytest.mark.smg
def test_smoke_smg(tmp_path: Path) -> None:
    raw = run_tiny_point(tmp_path, "SMG")
    assert_sane(raw, "SMG")


@pytest.mark.slow
@pytest.mark.smg
@pytest.mark.timeout(1800)
def test_full_matrix(tmp_path: Path) -> None:
    raw = run_bench(tmp_path, timeout_s=1500)
    assert len(raw["runs"]) == 2 * 12 * 3
    for run in raw["runs"]:
        assert run["metrics"]["errors"] == 0, (run["gateway"], run["point"], run["errors"])
        assert run["metrics"]["wrong_token_counts"] == 0, (run["gateway"], run["point"])
