"""CPU time and memory of a process tree, read from /proc (Linux only).

A gateway may be one process (SMG) or several (smg-node with worker processes later), so the unit measured is
the tree under the launched pid: every live descendant's own ``utime + stime`` (all its threads) plus
``cutime + cstime`` (descendants that already exited and were reaped). Sample before and after a run and
subtract. Resolution is one clock tick (usually 10 ms), so runs should last long enough to use many ticks.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True, slots=True)
class ProcStat:
    pid: int
    ppid: int
    cpu_ticks: int  # utime + stime + cutime + cstime
    rss_bytes: int


@dataclass(frozen=True, slots=True)
class TreeSample:
    """One reading of a process tree."""

    pids: tuple[int, ...]
    cpu_s: float
    rss_bytes: int


def read_stat(pid: int) -> ProcStat | None:
    """Parse /proc/<pid>/stat, or None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            raw = handle.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name is in parentheses and may hold spaces or parentheses: split after the last ')'.
    fields = raw[raw.rindex(b")") + 2 :].split()
    # fields[0] is field 3 (state) of proc(5): ppid is field 4, utime..cstime 14..17, rss 24.
    utime, stime, cutime, cstime = (int(value) for value in fields[11:15])
    return ProcStat(
        pid=pid,
        ppid=int(fields[1]),
        cpu_ticks=utime + stime + cutime + cstime,
        rss_bytes=int(fields[21]) * PAGE_BYTES,
    )


def _all_stats() -> dict[int, ProcStat]:
    stats: dict[int, ProcStat] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat = read_stat(int(name))
            if stat is not None:
                stats[stat.pid] = stat
    return stats


def sample_tree(root: int) -> TreeSample:
    """CPU seconds and resident memory of ``root`` and all its live descendants (zero if ``root`` is gone)."""
    stats = _all_stats()
    children: dict[int, list[int]] = {}
    for stat in stats.values():
        children.setdefault(stat.ppid, []).append(stat.pid)
    pids: list[int] = []
    todo = [root] if root in stats else []
    while todo:
        pid = todo.pop()
        pids.append(pid)
        todo.extend(children.get(pid, ()))
    ticks = sum(stats[pid].cpu_ticks for pid in pids)
    rss = sum(stats[pid].rss_bytes for pid in pids)
    return TreeSample(pids=tuple(sorted(pids)), cpu_s=ticks / CLOCK_TICKS_PER_S, rss_bytes=rss)


def machine_busy_s() -> float:
    """CPU seconds all cores of the machine spent busy since boot (from /proc/stat), to tell how much of a
    run's CPU went to other processes."""
    with open("/proc/stat", "rb") as handle:
        fields = handle.readline().split()
    # cpu user nice system idle iowait irq softirq steal ...: everything but idle and iowait is busy.
    values = [int(value) for value in fields[1:9]]
    busy = sum(values) - values[3] - values[4]
    return busy / CLOCK_TICKS_PER_S


def own_cpu_s() -> float:
    """This process's CPU seconds (all threads), at full resolution."""
    return time.process_time()


def thread_cpu_s(pids: tuple[int, ...]) -> dict[str, float]:
    """CPU seconds (utime + stime) per thread of ``pids``, keyed ``"<pid>/<thread name>"`` for each process's
    main thread and ``"<pid>/<thread name>/<tid>"`` for the others (Python < 3.14 does not name OS threads).
    Subtract two readings to see which thread did the work."""
    totals: dict[str, float] = {}
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except FileNotFoundError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/stat", "rb") as handle:
                    raw = handle.read()
            except FileNotFoundError:
                continue
            name = raw[raw.index(b"(") + 1 : raw.rindex(b")")].decode("utf-8", "replace").rstrip("0123456789_")
            fields = raw[raw.rindex(b")") + 2 :].split()
            key = f"{pid}/{name}" if tid == str(pid) else f"{pid}/{name}/{tid}"
            totals[key] = totals.get(key, 0.0) + (int(fields[11]) + int(fields[12])) / CLOCK_TICKS_PER_S
    return totals
