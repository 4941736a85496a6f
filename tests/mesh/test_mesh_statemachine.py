"""Hypothesis drives a simulated cluster through deliveries, loss, partitions, heals, stalls and crashes.

Invariants, checked after every step:
  * no live member ever considers itself suspect, dead or left;
  * every member's own incarnation, and every observer's view of every member's incarnation, only grows;
  * no observer knows a member at an incarnation the member itself never reached.
And at the end, after healing everything and a quiet period, all live members converge to the same
view: exactly the live members alive.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from mesh.config import MeshConfig
from mesh.member import MemberState
from mesh.sim import Link, SimNetwork, SimNode

# Fast timers so that a few simulated minutes cover many protocol rounds; dead members are never reaped
# so that every (observer, member) pair stays visible to the monotonicity check.
CONFIG = MeshConfig.lan(
    probe_interval_s=0.5,
    probe_timeout_s=0.2,
    gossip_interval_s=0.1,
    push_pull_interval_s=5.0,
    reconnect_interval_s=3.0,
    gossip_to_the_dead_time_s=1e9,
)
N = 5
SETTLE_S = 120.0


class MeshMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.net = SimNetwork(0)
        self.nodes: list[SimNode] = []
        self.seen: dict[tuple[str, str], int] = {}

    @initialize(seed=st.integers(0, 2**32 - 1))
    def start(self, seed: int) -> None:
        self.net = SimNetwork(seed)
        # Check after every single event, not just between steps: a transient violation (an incarnation
        # lowered and then refuted a few milliseconds later) must not slip through.
        self.net.on_step = self.check_node
        self.nodes = self.net.cluster(N, CONFIG)
        self.net.run_for(2.0)

    def check_node(self, node: SimNode) -> None:
        if not node.live:
            return
        me = node.swim.member(node.name)
        assert me is not None and me.state == MemberState.ALIVE, (node.name, me)
        for m in node.swim.members():
            key = (node.name, m.name)
            assert m.incarnation >= self.seen.get(key, 0), (self.net.now, key, m.incarnation, self.seen.get(key))
            self.seen[key] = m.incarnation

    def live(self) -> list[SimNode]:
        return [n for n in self.nodes if n.live]

    @rule(seconds=st.floats(0.05, 5.0))
    def deliver(self, seconds: float) -> None:
        self.net.run_for(seconds)

    @rule(loss=st.sampled_from([0.0, 0.05, 0.2, 0.5]), jitter=st.sampled_from([0.0005, 0.02, 0.2]))
    def drop(self, loss: float, jitter: float) -> None:
        self.net.default_link = Link(loss=loss, jitter_s=jitter, duplicate=0.05)

    @rule(mask=st.integers(1, 2**N - 2))
    def partition(self, mask: int) -> None:
        side_a = [n for i, n in enumerate(self.nodes) if mask >> i & 1]
        side_b = [n for i, n in enumerate(self.nodes) if not mask >> i & 1]
        self.net.partition(side_a, side_b)

    @rule(src=st.integers(0, N - 1), dst=st.integers(0, N - 1))
    def one_way_block(self, src: int, dst: int) -> None:
        if src != dst:
            self.net.block(self.nodes[src], self.nodes[dst])

    @rule()
    def heal(self) -> None:
        self.net.heal()
        self.net.default_link = Link()

    @precondition(lambda self: len(self.live()) > 2)
    @rule(index=st.integers(0, N - 1))
    def crash(self, index: int) -> None:
        self.net.crash(self.nodes[index])

    @rule(index=st.integers(0, N - 1), seconds=st.floats(0.1, 4.0), pause=st.booleans())
    def stall(self, index: int, seconds: float, pause: bool) -> None:
        self.net.stall(self.nodes[index], self.net.now, seconds, "pause" if pause else "inbound")

    @invariant()
    def never_declares_itself_gone(self) -> None:
        for node in self.live():
            me = node.swim.member(node.name)
            assert me is not None and me.state == MemberState.ALIVE, (node.name, me)

    @invariant()
    def incarnations_only_grow(self) -> None:
        own = {node.name: node.swim.incarnation for node in self.nodes}
        for node in self.live():
            for m in node.swim.members():
                key = (node.name, m.name)
                assert m.incarnation >= self.seen.get(key, 0), (key, m.incarnation, self.seen.get(key))
                assert m.incarnation <= own[m.name], (key, m.incarnation, own[m.name])
                self.seen[key] = m.incarnation

    def teardown(self) -> None:
        if not self.nodes:
            return
        self.net.heal()
        self.net.default_link = Link()
        converged = self.net.run_until_true(self.net.converged, timeout_s=SETTLE_S, step_s=1.0)
        views = {n.name: sorted((m.name, m.state.name) for m in n.swim.members()) for n in self.live()}
        assert converged, views


TestMeshMachine = MeshMachine.TestCase
TestMeshMachine.settings = settings(max_examples=40, stateful_step_count=40, deadline=None)
