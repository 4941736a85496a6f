"""Long chaos runs (`scripts/check --slow`): lan detection over several kills, a partition with the lan
profile, and a 10-minute soak of random kills, pauses and restarts."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos.cluster import LAN_PROFILE, Cluster, Node, Profile, free_port, loopback_nodes
from chaos.measure import CONVERGE_TIMEOUT_S, kill_and_restart
from chaos.netns import missing_facility
from chaos.test_partition import run_helper
from mesh.scenarios import percentile

pytestmark = pytest.mark.slow

NODES = 5
#: MESH-NOTES G1 with memberlist's LAN profile (1 s probes): every survivor within p50 6 s, p99 12 s.
G1_LAN_P50_S, G1_LAN_P99_S = 6.0, 12.0
#: Headroom for two busy cores.
SLACK = 1.5
LAN_KILLS = 6
SOAK_S = 600.0
#: After each soak action: how long to keep watching for a false death with everyone running.
SOAK_WATCH_S = 5.0


@pytest.fixture
def cluster_of(model_dir: Path, worker_url: str, tmp_path: Path) -> Iterator[Cluster]:
    """An empty cluster whose profile the test sets; every node it starts is killed at the end."""
    with Cluster(workdir=tmp_path, model_dir=model_dir, worker_url=worker_url, profile=LAN_PROFILE) as cluster:
        yield cluster


def _start_five(cluster: Cluster) -> list[Node]:
    port = free_port([f"127.0.0.{k}" for k in range(1, NODES + 1)])
    for node in loopback_nodes(NODES, mesh_port=port):
        cluster.add(node)
    nodes = list(cluster.nodes.values())
    cluster.start(*nodes)
    cluster.wait_up(*nodes)
    cluster.wait_converged(nodes, timeout_s=CONVERGE_TIMEOUT_S)
    return nodes


@pytest.mark.timeout(600)
def test_lan_profile_detection_over_several_kills(cluster_of: Cluster) -> None:
    _start_five(cluster_of)
    found = kill_and_restart(cluster_of, LAN_KILLS, pause_s=1.3)
    every = found.every_survivor_s
    message = f"lan, {LAN_KILLS} kills, every survivor marked it dead after: {', '.join(f'{t:.2f}' for t in every)} s"
    print(message)
    assert percentile(every, 50) <= G1_LAN_P50_S * SLACK, message
    assert percentile(every, 99) <= G1_LAN_P99_S * SLACK, message


@pytest.mark.timeout(400)
def test_a_partition_with_the_lan_profile_is_detected_and_heals(model_dir: Path, tmp_path: Path) -> None:
    reason = missing_facility()
    if reason is not None:
        pytest.skip(f"real partitions need unshare and nftables: {reason}")
    result = run_helper(tmp_path, model_dir, LAN_PROFILE)
    print(
        f"lan partition: detected within {result['partition_detected_s']:.2f} s, healed in {result['healed_s']:.1f} s"
    )
    for observer, view in result["final"].items():
        assert set(view.values()) == {"alive"}, f"{observer}: {view}"


def _false_deaths(cluster: Cluster, duration_s: float, running: set[str]) -> list[str]:
    """Every (observer saw member dead) over ``duration_s`` where the member's process is running."""
    seen = cluster.watch(cluster.running(), duration_s, ["dead"])
    return [s for s in seen if s.split(" ")[2] in running]


@pytest.mark.timeout(SOAK_S + 300)
def test_soak_random_kills_pauses_and_restarts(cluster_of: Cluster, profile: Profile) -> None:
    cluster_of.profile = profile
    nodes = _start_five(cluster_of)
    # The seed, restarted after a graceful leave, must join someone: members that left are never
    # reconnected to (only failed ones are), so a seed without --join would stay a cluster of its own.
    nodes[0].join = (nodes[1].mesh_addr,)
    rng = random.Random(7)
    pause_s = 0.75 * profile.suspicion_min_s(NODES)
    false: list[str] = []
    actions: dict[str, int] = {"kill": 0, "term": 0, "stop": 0}
    deadline = time.monotonic() + SOAK_S
    while time.monotonic() < deadline:
        action = rng.choice(sorted(actions))
        victim = rng.choice(nodes)
        others = [n for n in nodes if n is not victim]
        actions[action] += 1
        if action == "stop":
            cluster_of.stop(victim)
            try:
                false += [s for s in cluster_of.watch(others, pause_s, ["dead"]) if f" {victim.name} " in s]
            finally:
                cluster_of.cont(victim)
        else:
            if action == "kill":
                cluster_of.kill(victim)
                cluster_of.wait_state(others, victim.name, ["dead"], timeout_s=60)
            else:
                assert cluster_of.terminate(victim) == 0, cluster_of.tail(victim)
                seen = cluster_of.wait_state(others, victim.name, ["left", "dead"], timeout_s=60)
                false += [
                    f"{name} saw {victim.name} dead after SIGTERM" for name, m in seen.items() if m.state == "dead"
                ]
            cluster_of.start(victim)
            cluster_of.wait_up(victim)
        cluster_of.wait_converged(nodes, timeout_s=CONVERGE_TIMEOUT_S)
        false += _false_deaths(cluster_of, SOAK_WATCH_S, {n.name for n in nodes})
        crashed = [n.name for n in nodes if not n.running]
        assert not crashed, f"node processes exited on their own: {crashed}"
    print(f"soak {SOAK_S:.0f} s ({profile.label}): {actions}; false deaths: {false or 'none'}")
    assert not false, f"false deaths during the soak ({actions}): {false}"
