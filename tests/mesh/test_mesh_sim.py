"""The simulated network itself, and whole-cluster behaviour under its faults."""

from __future__ import annotations

import time

from mesh.config import MeshConfig
from mesh.member import MemberState
from mesh.sim import Link, SimNetwork

LAN = MeshConfig.lan()


def _run(seed: int) -> list[tuple[float, str, str, str]]:
    net = SimNetwork(seed, link=Link(loss=0.05, jitter_s=0.01, duplicate=0.05))
    nodes = net.cluster(6, LAN)
    net.run_for(20)
    net.crash(nodes[2])
    net.partition(nodes[:2], nodes[3:])
    net.run_for(20)
    net.heal()
    net.run_for(60)
    return [(e.time, e.observer, e.member, e.kind) for e in net.events]


def test_same_seed_same_history_different_seed_different_history() -> None:
    assert _run(3) == _run(3)
    assert _run(3) != _run(4)


def test_thousands_of_simulated_seconds_per_cpu_second() -> None:
    net = SimNetwork(1)
    net.cluster(5, LAN)
    start = time.process_time()
    net.run_for(2000)
    assert time.process_time() - start < 2.0  # typically ~0.6 s on a busy 2-core box
    assert net.converged()


def test_loss_reorder_and_duplication_do_not_break_a_cluster() -> None:
    net = SimNetwork(5, link=Link(loss=0.05, delay_s=0.002, jitter_s=0.05, duplicate=0.2))
    nodes = net.cluster(8, LAN)
    net.run_for(300)
    assert net.converged()
    assert sum(n.swim.metrics().deaths for n in nodes) == 0


def test_partition_heals_by_reconnecting_even_after_reaping() -> None:
    config = LAN.with_(gossip_to_the_dead_time_s=10.0, reconnect_interval_s=5.0)
    net = SimNetwork(11)
    nodes = net.cluster(6, config)
    net.run_for(10)
    left, right = nodes[:3], nodes[3:]
    net.partition(left, right)
    assert net.run_until_true(lambda: all(net.all_see(r.name, {MemberState.DEAD}, left) for r in right), timeout_s=60)
    net.run_for(60)  # long enough for both sides to reap each other (they only remember the failed list)
    assert all(n.swim.member(r.name) is None for n in left for r in right)
    net.heal()
    assert net.run_until_true(net.converged, timeout_s=60)


def test_one_way_link_failure_does_not_kill_anyone() -> None:
    net = SimNetwork(12)
    a, b, c, d = net.cluster(4, LAN)
    net.block(a, b)
    net.block(c, d)
    net.run_for(300)
    assert net.converged()
    assert sum(n.swim.metrics().deaths for n in (a, b, c, d)) == 0


def test_isolated_member_is_declared_dead_and_rejoins_after_heal() -> None:
    net = SimNetwork(13)
    nodes = net.cluster(5, LAN)
    loner = nodes[4]
    net.partition([loner], nodes[:4])
    assert net.run_until_true(lambda: net.all_see(loner.name, {MemberState.DEAD}, nodes[:4]), timeout_s=60)
    # The loner sees everyone else dead, but never itself. Slowly: its health score is maxed (8x slower
    # probes) and nobody can confirm its suspicions, so each runs the full 6x timeout. That is Lifeguard
    # doing its job -- the isolated node is the one most likely to be wrong.
    assert net.run_until_true(
        lambda: all(m.state == MemberState.DEAD for m in loner.swim.members() if m.name != loner.name),
        timeout_s=120,
    )
    assert loner.swim.member(loner.name).state == MemberState.ALIVE  # type: ignore[union-attr]
    net.heal()
    assert net.run_until_true(net.converged, timeout_s=60)


def test_pause_shorter_than_the_suspicion_timeout_is_not_a_death() -> None:
    net = SimNetwork(14)
    nodes = net.cluster(5, LAN)
    sleeper = nodes[2]
    net.stall(sleeper, net.now + 1.0, 3.0, mode="pause")  # SIGSTOP for 3 s; suspicion min is 4 s
    net.run_for(30)
    assert net.converged()
    assert sum(n.swim.metrics().deaths for n in nodes) == 0
    assert sleeper.swim.metrics().refutations >= 1  # it was suspected, and refuted on waking
