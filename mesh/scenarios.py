"""Measurement scenarios over the simulated network, shared by the test suite and ``bench/mesh_sim.py``.

Each function builds a fresh :class:`~mesh.sim.SimNetwork` from a seed, so every figure is reproducible.
They measure the goals of MESH-NOTES.md: crash detection time (G1), false deaths under loss (G2) and
under a stalling node (G3), dissemination (G4), refutation (G5), per-node bandwidth (G6), and join
convergence of large clusters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mesh.codec import encode_message, seal_packet
from mesh.config import MeshConfig
from mesh.member import MemberState, NodeMeta
from mesh.messages import Suspect
from mesh.sim import Link, SimNetwork, SimNode, StallMode
from mesh.swim import push_pull_scale

#: The "200 ms probe" profile of the goals: LAN with a five times faster failure detector.
FAST = MeshConfig.lan(probe_interval_s=0.2, probe_timeout_s=0.1)

#: Simulated time given to a fresh cluster before a measurement (joins, first push-pulls, queues drain).
SETTLE_S = 20.0


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def settled_cluster(config: MeshConfig, n: int, seed: int, *, link: Link | None = None) -> SimNetwork:
    """``n`` nodes joined through the first, given SETTLE_S of quiet and then until they converge (gossip
    reaches everyone only with high probability; push-pull repairs the rest). Raises AssertionError if
    the cluster did not converge within two push-pull intervals."""
    net = SimNetwork(seed, link=link)
    net.cluster(n, config)
    net.run_for(SETTLE_S)
    if not net.run_until_true(net.converged, timeout_s=2 * config.push_pull_interval_s, step_s=0.5):
        raise AssertionError(f"cluster of {n} (seed {seed}) did not converge")
    return net


def crash_detection(config: MeshConfig, *, n: int, seed: int) -> float:
    """Seconds from crashing a random member until every survivor has declared it dead."""
    net = settled_cluster(config, n, seed)
    net.run_for(net.rng.uniform(0, config.probe_interval_s * n))
    victim = net.rng.choice(list(net.nodes.values())[1:])
    start = net.now
    mark = len(net.events)
    net.crash(victim)
    survivors = {node.name for node in net.live_nodes()}
    if not net.run_until_true(lambda: net.all_see(victim.name, {MemberState.DEAD}), timeout_s=120.0, step_s=0.05):
        raise AssertionError(f"crash of {victim.name} not detected by everyone (seed {seed})")
    seen = {
        e.observer: e.time
        for e in reversed(net.events[mark:])
        if e.member == victim.name and e.kind == "leave" and e.state == MemberState.DEAD
    }
    return max(seen[name] for name in survivors) - start


@dataclass(frozen=True, slots=True)
class FalsePositives:
    #: A live member declared dead by some observer (each observer's declaration counts once).
    false_deaths: int
    #: Alive -> suspect transitions summed over all observers (true ones about a stalled node included).
    suspicions: int
    #: Probes the stalled node failed: all of them are false accusations of healthy members.
    accusations_by_stalled: int


def false_positives(
    config: MeshConfig,
    *,
    n: int,
    seed: int,
    duration_s: float,
    loss: float = 0.0,
    stall_s: float = 0.0,
    stall_period_s: float = 1.0,
    stall_mode: StallMode = "inbound",
) -> FalsePositives:
    """Run ``duration_s`` with ``loss`` on every link and, if ``stall_s``, the last member stalling
    ``stall_s`` in every ``stall_period_s``. Nobody crashes, so every death is a false positive."""
    net = settled_cluster(config, n, seed)
    nodes = list(net.nodes.values())
    stalled = nodes[-1]
    net.default_link = Link(loss=loss)
    start = net.now
    if stall_s > 0:
        net.periodic_stall(
            stalled,
            period_s=stall_period_s,
            duration_s=stall_s,
            start=start,
            end=start + duration_s,
            mode=stall_mode,
        )
    mark = len(net.events)
    before = [node.swim.metrics() for node in nodes]
    net.run_for(duration_s)
    after = [node.swim.metrics() for node in nodes]
    deaths = sum(1 for e in net.events[mark:] if e.kind == "leave" and e.state == MemberState.DEAD)
    suspicions = sum(a.suspicions - b.suspicions for a, b in zip(after, before, strict=True))
    accusations = after[-1].probes_failed - before[-1].probes_failed if stall_s > 0 else 0
    return FalsePositives(deaths, suspicions, accusations)


def _wait_everyone(net: SimNetwork, name: str, min_incarnation: int, timeout_s: float) -> float:
    start = net.now

    def done() -> bool:
        for node in net.live_nodes():
            m = node.swim.member(name)
            if m is None or m.state != MemberState.ALIVE or m.incarnation < min_incarnation:
                return False
        return True

    step = net.nodes[name].swim.config.gossip_interval_s / 20
    if not net.run_until_true(done, timeout_s=timeout_s, step_s=step):
        raise AssertionError(f"update about {name} did not reach everyone in {timeout_s}s")
    return net.now - start


def dissemination_rounds(config: MeshConfig, *, n: int, seed: int) -> float:
    """Gossip intervals until a metadata update from a random member has reached every member."""
    net = settled_cluster(config, n, seed)
    net.run_for(net.rng.uniform(0, config.gossip_interval_s))
    origin = net.rng.choice(list(net.nodes.values()))
    net.update_meta(origin, NodeMeta(version="v2"))
    inc = origin.swim.incarnation
    # Each holder sends an update retransmit-limit times to random members, so a given member misses it
    # with probability ~e^-limit; push-pull repairs that, hence a timeout beyond a push-pull interval.
    timeout = 2 * push_pull_scale(config.push_pull_interval_s, n) + 10
    return _wait_everyone(net, origin.name, inc, timeout) / config.gossip_interval_s


@dataclass(frozen=True, slots=True)
class Refutation:
    #: Gossip intervals from the false suspicion until the suspect refuted it.
    to_refute: float
    #: Gossip intervals from the refutation until every member had it.
    to_everyone: float


def refutation(config: MeshConfig, *, n: int, seed: int) -> Refutation:
    """A random member falsely suspects another; how fast the truth spreads."""
    net = settled_cluster(config, n, seed)
    net.run_for(net.rng.uniform(0, config.gossip_interval_s))
    accuser, victim = net.rng.sample(list(net.nodes.values()), 2)
    inc = victim.swim.incarnation
    # The accuser's own probe "failed": a suspect message from itself, as its probe loop would raise.
    packet = seal_packet(encode_message(Suspect(inc, victim.name, accuser.name)), None)
    start = net.now
    net.inject(accuser, packet, accuser.addr)
    if not net.run_until_true(lambda: victim.swim.incarnation > inc, timeout_s=30.0, step_s=0.002):
        raise AssertionError(f"{victim.name} never refuted (seed {seed})")
    refuted = net.now
    spread = _wait_everyone(net, victim.name, inc + 1, 30.0)
    interval = config.gossip_interval_s
    return Refutation((refuted - start) / interval, spread / interval)


def bandwidth(config: MeshConfig, *, n: int, seed: int, duration_s: float) -> float:
    """Steady-state bytes sent per second per member (UDP and TCP payloads, no IP/UDP headers)."""
    net = settled_cluster(config, n, seed)
    nodes = list(net.nodes.values())
    before = sum(node.swim.metrics().bytes_out for node in nodes)
    net.run_for(duration_s)
    after = sum(node.swim.metrics().bytes_out for node in nodes)
    return (after - before) / duration_s / n


def join_convergence(config: MeshConfig, *, n: int, seed: int) -> float:
    """Seconds until ``n`` members, all joining through one seed at once, see each other alive."""
    net = SimNetwork(seed)
    seed_node = net.add_node(config)
    joiners: list[SimNode] = [net.add_node(config) for _ in range(n - 1)]
    for node in joiners:
        net.join(node, [seed_node])
    if not net.run_until_true(net.converged, timeout_s=120.0, step_s=config.gossip_interval_s):
        raise AssertionError(f"{n} members did not converge (seed {seed})")
    return net.now
