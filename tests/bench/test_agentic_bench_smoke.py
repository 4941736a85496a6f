"""The agentic benchmark end to end: the real CLI, a real sim worker (Qwen folder: thinking and Hermes calls),
real gateways, a one-second loop. The full run (~15 min, three folders, three repetitions) is not a test."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_quick(out_dir: Path, gateway: str) -> dict[str, Any]:
    cmd = [
        sys.executable, "-m", "bench.agentic_bench", "--quick",
        "--gateways", gateway,
        "--duration-s", "1.5",
        "--token-duration-s", "1",
        "--out-dir", str(out_dir),
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}"
    assert "| calls ok / call answers (parallel) |" in done.stdout
    assert "| thinking + prose (thinking on) |" in done.stdout
    raw: dict[str, Any] = json.loads((out_dir / "agentic_bench-latest.json").read_text())
    assert raw["failures"] == []
    return raw


def assert_agent_loop_works(raw: dict[str, Any], gateway: str) -> None:
    (run,) = raw["runs"]
    assert run["gateway"] == gateway and run["folder"] == "qwen"
    outcomes = run["outcomes"]
    # Every call the engine wrote came back as a valid call, and every tool result got a plain answer.
    assert outcomes.get("call_ok", 0) >= 2, outcomes
    assert set(outcomes) <= {"call_ok", "text"}, run["examples"]
    assert run["answers"] == outcomes["call_ok"] and run["answers_ok"] == run["answers"]
    assert run["errors"] == 0, run["examples"]
    assert run["turns"] == run["conversations"] + run["answers"]
    assert 0 < run["ttft_p50_ms"] <= run["ttft_p99_ms"]
    assert run["cpu_ms_per_turn"] > 0
    # The parser proxy found prose and call answers for the same prompt and timed both.
    assert math.isfinite(run["plain_us_per_token"]) and run["plain_us_per_token"] > 0, run["notes"]
    assert math.isfinite(run["markup_us_per_token"]) and run["markup_us_per_token"] > 0, run["notes"]
    # Qwen thinks: with thinking on, answers are a reasoning run then prose, longer than the prose alone.
    assert math.isfinite(run["thinking_us_per_token"]) and run["thinking_us_per_token"] > 0, run["notes"]
    assert run["thinking_tokens"] > run["plain_tokens"]
    assert run["notes"] == [], run["notes"]


def test_smoke_smg_node(tmp_path: Path) -> None:
    assert_agent_loop_works(run_quick(tmp_path, "smg-node"), "smg-node")


@pytest.mark.smg
def test_smoke_smg(tmp_path: Path) -> None:
    assert_agent_loop_works(run_quick(tmp_path, "SMG"), "SMG")
