"""CPU and memory of a process tree from /proc."""

from __future__ import annotations

import os
import subprocess
import sys

from bench.proc import machine_busy_s, read_stat, sample_tree


def test_own_stat_is_read() -> None:
    stat = read_stat(os.getpid())
    assert stat is not None
    assert stat.ppid == os.getppid()
    assert stat.rss_bytes > 0
    assert read_stat(2**22 + 12345) is None


def test_tree_includes_a_busy_child() -> None:
    busy = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\nprint(1)"
    child = subprocess.Popen([sys.executable, "-c", busy + "\nimport sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
    try:
        assert child.stdout is not None
        child.stdout.readline()  # the child has burnt its CPU and now waits
        sample = sample_tree(os.getpid())
        assert child.pid in sample.pids
        own = read_stat(os.getpid())
        assert own is not None
        assert sample.cpu_s >= 0.25
    finally:
        child.communicate(b"")
    assert machine_busy_s() > 0
