"""bench.instructions end to end (slow tier: the node runs under valgrind): it counts a real node's requests."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_counts_instructions_of_a_real_node(tmp_path: Path) -> None:
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        pytest.skip("valgrind is not installed (Debian's valgrind package)")
    cmd = [sys.executable, "-m", "bench.instructions", "--requests", "10", "--warmup", "3", "--out-dir", str(tmp_path)]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=840, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    match = re.search(r"10 requests, 0 errors, ([\d,]+) instructions/request", done.stdout)
    assert match, done.stdout
    # A 200/20 streamed request costs millions of instructions; zero would mean nothing was counted.
    assert int(match.group(1).replace(",", "")) > 100_000
