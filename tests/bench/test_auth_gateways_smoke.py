"""bench.auth_gateways end to end at a tiny point: the real CLI, a real sim worker, real gateways in every auth
mode (each run also checks that its gateway refuses a request without credentials)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.auth_gateways import AuthRun, costs
from bench.report import Metrics

REPO = Path(__file__).resolve().parents[2]
OUTPUT_TOKENS = 8


def run_tiny(out_dir: Path, gateway: str) -> dict[str, Any]:
    cmd = [
        sys.executable, "-m", "bench.auth_gateways", "--quick",
        "--gateways", gateway,
        "--output", str(OUTPUT_TOKENS),
        "--concurrency", "2",
        "--duration-s", "1",
        "--warmup-s", "0.3",
        "--out-dir", str(out_dir),
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=90, check=False)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}"
    assert "| added µs/req |" in done.stdout
    raw: dict[str, Any] = json.loads((out_dir / "auth_gateways-latest.json").read_text())
    assert raw["failures"] == []
    for run in raw["runs"]:
        assert run["metrics"]["requests"] >= 5, run
        assert run["metrics"]["errors"] == 0, run["errors"]
        assert run["metrics"]["wrong_token_counts"] == 0
        assert run["metrics"]["gateway_cpu_ms_per_req"] > 0
    return raw


def test_smoke_smg_node_key_and_jwt(tmp_path: Path) -> None:
    raw = run_tiny(tmp_path, "smg-node")
    assert sorted(run["auth"] for run in raw["runs"]) == ["jwt", "key", "none"]
    assert sorted(cost["auth"] for cost in raw["costs"]) == ["jwt", "key"]
    for cost in raw["costs"]:
        assert cost["base_cpu_ms"] > 0 and cost["auth_cpu_ms"] > 0
        assert cost["added_us"] == pytest.approx((cost["auth_cpu_ms"] - cost["base_cpu_ms"]) * 1000)


@pytest.mark.smg
def test_smoke_smg_tenant_key(tmp_path: Path) -> None:
    raw = run_tiny(tmp_path, "SMG")
    assert sorted(run["auth"] for run in raw["runs"]) == ["key", "none"]
    (cost,) = raw["costs"]
    assert cost["gateway"] == "SMG" and cost["auth"] == "key"


def _run(gateway: str, auth: str, repetition: int, cpu_ms: float) -> AuthRun:
    fields = dict.fromkeys(Metrics.__dataclass_fields__, 100.0)
    return AuthRun(gateway, auth, repetition, Metrics(**{**fields, "gateway_cpu_ms_per_req": cpu_ms}), ())


def test_the_added_cost_pairs_each_repetition_with_its_own_baseline() -> None:
    """The machine drifts between repetitions (1, 2, 3 ms); auth adds 10 us in each, and that is what shows."""
    runs = [_run("smg-node", "none", r, 1.0 + r) for r in range(3)]
    runs += [_run("smg-node", "key", r, 1.01 + r) for r in range(3)]
    runs += [_run("SMG", "key", 0, 1.0)]  # no baseline: nothing to compare with
    (cost,) = costs(runs)
    assert (cost.gateway, cost.auth) == ("smg-node", "key")
    assert cost.added_us == pytest.approx(10.0)
    assert cost.added_pct == pytest.approx(0.5)  # 10 us of the 2 ms median
    assert cost.base_cpu_ms == pytest.approx(2.0) and cost.auth_cpu_ms == pytest.approx(2.01)
    assert not math.isnan(cost.base_req_s)
