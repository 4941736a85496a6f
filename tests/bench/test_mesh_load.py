"""bench.mesh_load end to end on the smallest mesh: real sim worker, two real meshed nodes and two independent
ones, one short repetition each."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_two_nodes_meshed_and_alone_report_cpu_per_request_and_throughput(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "bench.mesh_load", "--out-dir", str(tmp_path), "--nodes", "2", "--workers", "1"]
    cmd += ["--reps", "1", "--duration-s", "1", "--warmup-s", "0.3", "--settle-s", "0.5", "--concurrency", "3"]
    cmd += ["--prompt-tokens", "48", "--output-tokens", "4"]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}"
    assert "| nodes | variant | req/s | gateway CPU ms/req | vs 1 node | meshed / alone |" in done.stdout
    reps = json.loads((tmp_path / "mesh_load-latest.json").read_text())["reps"]
    assert sorted(rep["variant"] for rep in reps) == ["alone", "meshed"]
    for rep in reps:
        assert rep["nodes"] == 2
        # Both nodes served: the users are spread 2 + 1, and a node that answered nothing would fail its users.
        assert rep["requests"] >= 5 and rep["errors"] == 0, rep
        assert rep["gateway_cpu_s"] > 0 and rep["worker_cpu_s"] > 0
    (meshed_row,) = [line for line in done.stdout.splitlines() if line.startswith("| 2 | meshed |")]
    assert meshed_row.split("|")[6].strip().endswith("×")  # the mesh's own cost: meshed over alone at N = 2
