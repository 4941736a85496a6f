"""Crash-detection measurements over repeated kills, shared by the slow chaos tests and bench/mesh_real.py."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from chaos.cluster import Cluster

#: Wait for every survivor to declare the victim dead: far above lan's worst case (max suspicion ~24 s).
DETECT_TIMEOUT_S = 60.0
CONVERGE_TIMEOUT_S = 90.0


@dataclass(slots=True)
class Detections:
    every_survivor_s: list[float] = field(default_factory=list)  # per kill: the last survivor to mark it dead
    each_survivor_s: list[float] = field(default_factory=list)  # per kill and survivor
    rejoin_s: list[float] = field(default_factory=list)  # restart until alive everywhere


def kill_and_restart(
    cluster: Cluster, kills: int, report: Callable[[str], None] = print, pause_s: float = 0.0
) -> Detections:
    """Kill -9 the non-seed nodes of a converged ``cluster`` in turn, ``kills`` times; after each, wait
    until every survivor lists the victim dead, restart it and wait until all list all alive again.
    Raises TimeoutError when a step exceeds its bound."""
    out = Detections()
    nodes = list(cluster.nodes.values())
    for k in range(kills):
        victim = nodes[1 + k % (len(nodes) - 1)]
        survivors = [n for n in nodes if n is not victim]
        time.sleep(pause_s)  # a phase against the probe rounds that differs from kill to kill
        killed_at = cluster.kill(victim)
        seen = cluster.wait_state(survivors, victim.name, ["dead"], DETECT_TIMEOUT_S)
        times = sorted(m.changed_at - killed_at for m in seen.values())
        out.every_survivor_s.append(times[-1])
        out.each_survivor_s.extend(times)
        report(f"{cluster.profile.label}: kill {k + 1}/{kills} {victim.name}: " + " ".join(f"{t:.2f}" for t in times))
        started = time.monotonic()
        cluster.start(victim)
        cluster.wait_up(victim)
        cluster.wait_converged(nodes, timeout_s=CONVERGE_TIMEOUT_S)
        out.rejoin_s.append(time.monotonic() - started)
    return out
