"""The measurable goals G1-G6 of MESH-NOTES.md, over several seeds, Lifeguard on and off.

Quick versions run by default; the ``slow`` ones repeat them with more seeds and longer runs (the figures
in mesh/README.md come from ``bench/mesh_sim.py``, which runs the same scenarios).
"""

from __future__ import annotations

import math

import pytest

from mesh.config import MeshConfig
from mesh.scenarios import (
    FAST,
    bandwidth,
    crash_detection,
    dissemination_rounds,
    false_positives,
    join_convergence,
    percentile,
    refutation,
)

LAN = MeshConfig.lan()

#: Goals that hold with plain SWIM as well as with Lifeguard run under both (Lifeguard earns its keep in G2/G3).
LIFEGUARD = pytest.mark.parametrize("lifeguard", [True, False], ids=["lifeguard", "plain"])


def _profile(config: MeshConfig, lifeguard: bool) -> MeshConfig:
    return config if lifeguard else config.without_lifeguard()


# -- G1: a crash is detected by every survivor quickly --


@LIFEGUARD
def test_g1_crash_detection_lan(lifeguard: bool) -> None:
    times = [crash_detection(_profile(LAN, lifeguard), n=5, seed=s) for s in range(20)]
    assert percentile(times, 50) <= 6.0
    assert percentile(times, 99) <= 12.0


@LIFEGUARD
def test_g1_crash_detection_200ms_probes(lifeguard: bool) -> None:
    times = [crash_detection(_profile(FAST, lifeguard), n=5, seed=s) for s in range(20)]
    assert percentile(times, 99) <= 2.0


# -- G2: 10% loss on every link for 10 simulated minutes kills nobody --


@pytest.mark.parametrize("config", [LAN, LAN.with_(disable_tcp_pings=True)], ids=["tcp-fallback", "udp-only"])
def test_g2_no_false_death_under_ten_percent_loss(config: MeshConfig) -> None:
    deaths = [false_positives(config, n=5, seed=s, duration_s=600, loss=0.1).false_deaths for s in range(1, 4)]
    assert deaths == [0, 0, 0]


@pytest.mark.slow
def test_g2_slow_lifeguard_keeps_udp_only_loss_free_of_deaths() -> None:
    udp_only = LAN.with_(disable_tcp_pings=True)
    on = [false_positives(udp_only, n=5, seed=s, duration_s=600, loss=0.1).false_deaths for s in range(5)]
    off = [
        false_positives(udp_only.without_lifeguard(), n=5, seed=s, duration_s=600, loss=0.1).false_deaths
        for s in range(5)
    ]
    assert sum(on) == 0
    assert sum(off) > 0  # the scenario does stress plain SWIM


# -- G3: a stalling (gray) member --


def _g3(seeds: range, duration_s: float) -> tuple[int, int]:
    on = sum(false_positives(FAST, n=5, seed=s, duration_s=duration_s, stall_s=0.3).false_deaths for s in seeds)
    off = sum(
        false_positives(FAST.without_lifeguard(), n=5, seed=s, duration_s=duration_s, stall_s=0.3).false_deaths
        for s in seeds
    )
    return on, off


def test_g3_stalling_member_lifeguard_ten_times_fewer_false_deaths() -> None:
    # One member stops processing input for 300 ms in every second; probes every 200 ms.
    on, off = _g3(range(2), 300)
    assert off >= 10  # plain SWIM does kill healthy members here ...
    assert on == 0  # ... Lifeguard does not (so on <= off / 10)


@pytest.mark.slow
def test_g3_slow_stalling_member_over_more_seeds() -> None:
    on, off = _g3(range(5), 600)
    assert on * 10 <= off and off >= 30


@pytest.mark.parametrize("config", [LAN, LAN.without_lifeguard()], ids=["lifeguard", "plain"])
def test_g3_sigstop_shorter_than_the_suspicion_min_is_no_death(config: MeshConfig) -> None:
    result = false_positives(config, n=5, seed=2, duration_s=300, stall_s=3.0, stall_period_s=15.0, stall_mode="pause")
    assert result.false_deaths == 0
    assert result.suspicions > 0  # it was suspected every time, and refuted every time


# -- G4: dissemination within log2(n) + 3 gossip intervals --


@LIFEGUARD
@pytest.mark.parametrize("n", [3, 5, 10])
def test_g4_dissemination(n: int, lifeguard: bool) -> None:
    rounds = [dissemination_rounds(_profile(LAN, lifeguard), n=n, seed=s) for s in range(10)]
    assert max(rounds) <= math.log2(n) + 3


# -- G5: a refutation is everywhere within 2 gossip intervals --


@LIFEGUARD
def test_g5_refutation(lifeguard: bool) -> None:
    results = [refutation(_profile(LAN, lifeguard), n=5, seed=s) for s in range(10)]
    assert max(r.to_everyone for r in results) <= 2.0
    # The buddy system (Lifeguard) or else gossip tells the suspect at once.
    assert max(r.to_refute for r in results) <= 2.0


# -- G6: bandwidth per member does not grow with the cluster --


@LIFEGUARD
def test_g6_bandwidth_per_node_is_flat(lifeguard: bool) -> None:
    rates = [bandwidth(_profile(LAN, lifeguard), n=n, seed=1, duration_s=120) for n in (3, 5, 9)]
    assert max(rates) <= 1.5 * min(rates)
    assert max(rates) < 200  # bytes/s: ping + ack + a share of push-pull


# -- scale --


def test_fifty_members_joining_at_once_converge_quickly() -> None:
    assert join_convergence(LAN, n=50, seed=1) <= 5.0


@pytest.mark.slow
def test_two_hundred_members_joining_at_once_converge() -> None:
    assert join_convergence(LAN, n=200, seed=1) <= 30.0
