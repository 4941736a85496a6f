"""A real 3|2 partition (nftables input-hook drops inside `unshare -rn`), detected on both sides and healed."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from chaos.cluster import REPO, Profile
from chaos.netns import missing_facility

#: Bound on each wait inside the helper; healing waits for the mesh's reconnect round (30 s).
STEP_TIMEOUT_S = 60.0
#: Bound on the whole helper: start, converge, partition, heal, with each step at its bound.
HELPER_TIMEOUT_S = 240.0
SIDE_A, SIDE_B = ("n1", "n2", "n3"), ("n4", "n5")


def run_helper(workdir: Path, model_dir: Path, profile: Profile) -> dict[str, Any]:
    args = ["unshare", "-rn", sys.executable, "-m", "chaos.partition", "--workdir", str(workdir)]
    args += ["--model-path", str(model_dir), "--profile", profile.name, "--timeout-s", str(STEP_TIMEOUT_S)]
    if profile.probe_interval_s:
        args += ["--probe-interval-s", str(profile.probe_interval_s)]
    # Its own process group: on a timeout we kill the helper, and its nodes die with it (parent-death signal).
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=HELPER_TIMEOUT_S)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    lines = out.decode().strip().splitlines()
    assert lines, f"the partition helper printed nothing (exit {proc.returncode}):\n{err.decode()[-3000:]}"
    result: dict[str, Any] = json.loads(lines[-1])
    if not result["ok"]:
        logs = "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}" for p in sorted(workdir.glob("*.log"))
        )
        pytest.fail(f"partition helper failed: {result}\n{err.decode()[-2000:]}\n{logs}")
    return result


@pytest.mark.timeout(HELPER_TIMEOUT_S + 30)
def test_a_3_2_partition_is_detected_on_both_sides_and_heals(model_dir: Path, profile: Profile, tmp_path: Path) -> None:
    reason = missing_facility()
    if reason is not None:
        pytest.skip(f"real partitions need unshare and nftables: {reason}")
    result = run_helper(tmp_path, model_dir, profile)
    summary = (
        f"{result['profile']}: each side marked the other dead within {result['partition_detected_s']:.2f} s "
        f"({result['detected_s']}); healed in {result['healed_s']:.1f} s"
    )
    print(summary)
    during = result["alive_during_partition"]
    for side in (SIDE_A, SIDE_B):
        for name in side:
            assert during[name] == sorted(side), f"{name} lost a member of its own side: {during}; {summary}"
    for observer, row in result["detected_s"].items():
        other = SIDE_B if observer in SIDE_A else SIDE_A
        assert sorted(row) == sorted(other), f"{observer}: {row}"
    for observer, view in result["final"].items():
        assert view == dict.fromkeys(SIDE_A + SIDE_B, "alive"), f"after healing {observer} lists {view}; {summary}"
