"""The SWIM core's rules, each exercised on the simulated network or fed bytes directly."""

from __future__ import annotations

import itertools
import random

from mesh.actions import Action, SendPacket, StreamRequest
from mesh.codec import encode_message, open_packet, seal_packet
from mesh.config import MeshConfig
from mesh.limits import MAX_PACKET_BYTES, MAX_PENDING_ACKS, PROTOCOL_VERSION
from mesh.member import MemberState, NodeMeta
from mesh.messages import Ack, Alive, Dead, IndirectPing, Ping, Suspect
from mesh.sim import SimNetwork, SimNode
from mesh.swim import Swim

LAN = MeshConfig.lan()
ALIVE, SUSPECT, DEAD, LEFT = MemberState.ALIVE, MemberState.SUSPECT, MemberState.DEAD, MemberState.LEFT


def cluster(n: int, config: MeshConfig = LAN, seed: int = 1) -> tuple[SimNetwork, list[SimNode]]:
    net = SimNetwork(seed)
    nodes = net.cluster(n, config)
    assert net.run_until_true(net.converged, timeout_s=60)
    return net, nodes


def packet(*msgs: Suspect | Dead | Alive | Ping | Ack | IndirectPing) -> bytes:
    from mesh.codec import compound

    return seal_packet(compound([encode_message(m) for m in msgs]), None)


# -- probing --


def test_healthy_cluster_probes_without_failures() -> None:
    net, nodes = cluster(5)
    net.run_for(60)
    for node in nodes:
        m = node.swim.metrics()
        assert m.probes_sent >= 55 and m.probes_failed == 0 and m.suspicions == 0
        assert m.members_alive == 5 and m.health_score == 0


def _probe_targets(seed: int, n: int, rounds: int) -> list[str]:
    """The members one node of a settled ``n``-node cluster pings directly over about ``rounds`` rounds."""
    net, nodes = cluster(n, seed=seed)
    prober = nodes[0]
    targets: list[str] = []
    drain = prober.swim.drain_actions

    def tap() -> list[Action]:
        actions = drain()
        for action in actions:
            if isinstance(action, SendPacket):
                msgs = open_packet(action.data, None)
                targets.extend(m.target for m in msgs if isinstance(m, Ping) and m.source_name == prober.name)
        return actions

    prober.swim.drain_actions = tap  # type: ignore[method-assign]
    net.run_for(LAN.probe_interval_s * (n - 1) * rounds)
    assert sum(node.swim.metrics().probes_failed for node in nodes) == 0  # so no ping is a relayed one
    return targets


def test_every_member_is_probed_once_per_round_in_a_fresh_order_each_round() -> None:
    n, rounds = 6, 9
    targets = _probe_targets(1, n, rounds)
    others = {f"n{k}" for k in range(1, n)}
    assert len(targets) >= (n - 1) * (rounds - 1)
    # Observation starts mid-round: some offset splits the rest into rounds, each a permutation of the others.
    aligned = []
    for offset in range(n - 1):
        orders = [tuple(targets[i : i + n - 1]) for i in range(offset, len(targets) - (n - 2), n - 1)]
        if all(sorted(order) == sorted(others) for order in orders):
            aligned.append(orders)
    assert aligned, f"no split of {targets} into rounds probing each member once"
    orders = aligned[0]
    assert len(orders) >= rounds - 1
    # Reshuffled at every wrap: two consecutive rounds coincide with probability 1/120 for 5 members; a fixed
    # round-robin order would never change.
    changes = sum(a != b for a, b in itertools.pairwise(orders))
    assert changes >= len(orders) - 2, orders
    # The shuffle draws from the injected seeded RNG: the same seed probes in the same order, another does not.
    assert _probe_targets(1, n, rounds) == targets
    assert _probe_targets(2, n, rounds) != targets


def test_indirect_probe_saves_a_member_behind_a_broken_link() -> None:
    net, (a, b, c, d) = cluster(4, LAN.with_(disable_tcp_pings=True))
    net.block(a, b)  # asymmetric: a cannot reach b, everyone else can
    net.run_for(120)
    assert a.swim.metrics().indirect_probes_sent > 0
    assert all(n.swim.member("n1").state == ALIVE for n in (a, c, d))  # type: ignore[union-attr]
    assert sum(n.swim.metrics().probes_failed for n in (a, b, c, d)) == 0


def test_tcp_fallback_saves_a_member_whose_udp_is_filtered() -> None:
    net, (a, b, c) = cluster(3)
    for other in (a, c):
        net.block(other, b, streams=False)
        net.block(b, other, streams=False)
    net.run_for(60)
    assert a.swim.metrics().fallback_probes_sent > 0
    assert a.swim.member("n1").state == ALIVE  # type: ignore[union-attr]
    assert a.swim.metrics().probes_failed == 0


def test_relays_nack_a_dead_target_so_the_prober_stays_healthy() -> None:
    net, nodes = cluster(5)
    net.crash(nodes[4])
    net.run_for(3)  # enough for probes of the dead member, too little for it to be reaped
    failed = [n for n in nodes[:4] if n.swim.metrics().probes_failed]
    assert failed
    for node in failed:
        assert node.swim.metrics().nacks_received > 0
        assert node.swim.health_score == 0  # every relay nacked: the prober is not the problem


def test_isolated_node_raises_its_awareness_and_slows_down() -> None:
    net, nodes = cluster(5)
    lonely = nodes[0]
    for other in nodes[1:]:
        net.block(lonely, other)
    before = lonely.swim.metrics().probes_sent
    net.run_for(30)
    assert lonely.swim.health_score == LAN.awareness_max_multiplier - 1
    # Scaled up to 8x, it sent far fewer probes than the 30 of a healthy node.
    assert lonely.swim.metrics().probes_sent - before < 15


# -- suspicion, refutation, death --


def test_a_falsely_suspected_member_refutes_and_stays_alive() -> None:
    net, nodes = cluster(4)
    victim, accuser = nodes[2], nodes[0]
    inc = victim.swim.incarnation
    net.inject(accuser, packet(Suspect(inc, victim.name, accuser.name)), accuser.addr)
    assert accuser.swim.member(victim.name).state == SUSPECT  # type: ignore[union-attr]
    net.run_for(2)
    assert victim.swim.incarnation == inc + 1
    assert victim.swim.metrics().refutations == 1
    assert net.all_see(victim.name, {ALIVE})
    net.run_for(60)
    assert net.converged()


def test_a_member_refutes_its_own_death_certificate() -> None:
    net, nodes = cluster(3)
    victim = nodes[1]
    inc = victim.swim.incarnation
    net.inject(victim, packet(Dead(inc + 3, victim.name, "n0")), nodes[0].addr)
    assert victim.swim.incarnation == inc + 4
    assert victim.swim.member(victim.name).state == ALIVE  # type: ignore[union-attr]


def test_stale_accusation_makes_the_member_gossip_its_refutation_again() -> None:
    net, nodes = cluster(3)
    victim = nodes[1]
    net.inject(victim, packet(Suspect(victim.swim.incarnation, victim.name, "n0")), nodes[0].addr)
    inc = victim.swim.incarnation
    victim.swim.drain_actions()
    # The refutation is already out; an older accusation must re-announce it, not bump the incarnation.
    victim.swim.handle_packet(net.now, packet(Suspect(inc - 1, victim.name, "n2")), nodes[2].addr)
    victim.swim.handle_packet(net.now, packet(Ping(1, victim.name, "n2", nodes[2].addr)), nodes[2].addr)
    ack = victim.swim.drain_actions()[0]
    assert isinstance(ack, SendPacket)
    assert Alive(inc, victim.name, victim.addr, NodeMeta()) in open_packet(ack.data, None)
    assert victim.swim.incarnation == inc


def test_crash_is_detected_and_reported_once_per_observer() -> None:
    net, nodes = cluster(5)
    net.crash(nodes[3])
    mark = len(net.events)
    assert net.run_until_true(lambda: net.all_see("n3", {DEAD}), timeout_s=30)
    deaths = [e for e in net.events[mark:] if e.member == "n3" and e.kind == "leave"]
    assert sorted(e.observer for e in deaths) == ["n0", "n1", "n2", "n4"]
    assert all(e.state == DEAD for e in deaths)


def test_buddy_system_piggybacks_the_suspicion_on_the_probe() -> None:
    for buddy in (True, False):
        net, nodes = cluster(3, LAN.with_(buddy_system=buddy))
        prober, suspect = nodes[0], nodes[1]
        net.inject(prober, packet(Suspect(suspect.swim.incarnation, suspect.name, prober.name)), prober.addr)
        prober.swim.drain_actions()
        seen: list[list[object]] = []
        for _ in range(200):  # until the prober's round-robin reaches the suspect
            t = prober.swim.next_deadline()
            assert t is not None
            prober.swim.handle_timer(t)
            for action in prober.swim.drain_actions():
                if isinstance(action, SendPacket) and action.addr == suspect.addr:
                    msgs = open_packet(action.data, None)
                    if any(isinstance(m, Ping) for m in msgs):
                        seen.append(list(msgs))
            if seen:
                break
        probe = seen[0]
        has_suspect = any(isinstance(m, Suspect) and m.node == suspect.name for m in probe)
        assert has_suspect is buddy


def test_the_ack_carries_the_refutation_back_to_the_accuser() -> None:
    swim = Swim(LAN.with_(node_name="me"), addr="10.0.0.1:7946", now=0.0, rng=random.Random(1))
    swim.handle_packet(0.0, packet(Alive(1, "peer", "10.0.0.2:7946", NodeMeta())), "10.0.0.2:7946")
    for _ in range(20):  # drain the gossip of our own and the peer's alive
        swim.handle_timer(swim.next_deadline() or 0.0)
    swim.drain_actions()
    now = 100.0
    swim.handle_packet(now, packet(Ping(9, "me", "peer", "10.0.0.2:7946"), Suspect(1, "me", "peer")), "10.0.0.2:7946")
    (ack,) = swim.drain_actions()
    assert isinstance(ack, SendPacket) and ack.addr == "10.0.0.2:7946"
    msgs = open_packet(ack.data, None)
    assert msgs[0] == Ack(9)
    assert Alive(2, "me", "10.0.0.1:7946", NodeMeta()) in msgs


# -- leaving and coming back --


def test_graceful_leave_is_left_not_dead() -> None:
    net, nodes = cluster(4)
    leaver = nodes[2]
    mark = len(net.events)
    net.leave(leaver)
    assert net.run_until_true(lambda: leaver.swim.leave_complete, timeout_s=5)
    assert net.run_until_true(lambda: net.all_see(leaver.name, {LEFT}, nodes), timeout_s=5)
    net.crash(leaver)
    net.run_for(20)  # not yet reaped (gossip_to_the_dead_time_s is 30)
    assert all(n.swim.member(leaver.name).state == LEFT for n in nodes if n is not leaver)  # type: ignore[union-attr]
    leaves = [e for e in net.events[mark:] if e.member == leaver.name and e.kind == "leave"]
    assert leaves and all(e.state == LEFT for e in leaves)
    assert sum(n.swim.metrics().deaths for n in nodes) == 0


def test_dead_member_restarting_with_a_higher_incarnation_is_alive_again() -> None:
    net, nodes = cluster(4)
    phoenix = nodes[3]
    net.crash(phoenix)
    assert net.run_until_true(lambda: net.all_see("n3", {DEAD}, nodes[:3]), timeout_s=30)
    dead_inc = nodes[0].swim.member("n3").incarnation  # type: ignore[union-attr]
    mark = len(net.events)
    net.restart(phoenix, LAN, [nodes[0]])  # same name and address, incarnation starts over
    assert net.run_until_true(net.converged, timeout_s=10)
    assert phoenix.swim.incarnation > dead_inc
    joins = {e.observer for e in net.events[mark:] if e.member == "n3" and e.kind == "join"}
    assert {"n0", "n1", "n2"} <= joins


def test_name_at_a_new_address_waits_for_the_reclaim_time() -> None:
    config = LAN.with_(dead_node_reclaim_time_s=10.0)
    net, nodes = cluster(3, config)
    old = nodes[2]
    net.crash(old)
    assert net.run_until_true(lambda: net.all_see("n2", {DEAD}, nodes[:2]), timeout_s=30)
    died = net.now
    reborn = net.add_node(config, "n2", addr="10.0.9.9:7946")
    net.join(reborn, [nodes[0]])
    net.run_for(1)
    assert nodes[0].swim.member("n2").addr == old.addr  # type: ignore[union-attr]
    net.run_until(died + 12)
    net.join(reborn, [nodes[0]])  # a real node would keep retrying; the simulator joins once per call
    assert net.run_until_true(lambda: net.all_see("n2", {ALIVE}, nodes[:2]), timeout_s=30)
    assert nodes[1].swim.member("n2").addr == "10.0.9.9:7946"  # type: ignore[union-attr]


def test_conflicting_address_for_a_live_name_is_refused() -> None:
    net, nodes = cluster(3)
    impostor = Alive(50, "n1", "10.6.6.6:7946", NodeMeta())
    for node in (nodes[0], nodes[2]):
        net.inject(node, packet(impostor), "10.6.6.6:7946")
    net.run_for(5)
    assert all(n.swim.member("n1").addr == nodes[1].addr for n in nodes)  # type: ignore[union-attr]


def test_metadata_update_reaches_everyone_as_an_update_event() -> None:
    net, nodes = cluster(4)
    mark = len(net.events)
    net.update_meta(nodes[1], NodeMeta.create(http_addr="10.0.0.2:8080", roles={"gpu": "h100"}))
    assert net.run_until_true(
        lambda: all(n.swim.member("n1").roles == {"gpu": "h100"} for n in nodes),  # type: ignore[union-attr]
        timeout_s=5,
    )
    updates = {e.observer for e in net.events[mark:] if e.kind == "update" and e.member == "n1"}
    assert updates == {"n0", "n1", "n2", "n3"}


# -- hostile or broken input --


def test_ping_for_another_member_is_not_acked() -> None:
    swim = Swim(LAN.with_(node_name="me"), addr="10.0.0.1:7946", now=0.0, rng=random.Random(1))
    swim.drain_actions()
    swim.handle_packet(1.0, packet(Ping(5, "someone-else", "x", "10.0.0.2:7946")), "10.0.0.2:7946")
    assert swim.drain_actions() == []
    assert swim.handle_stream(1.0, _frame(Ping(5, "someone-else", "x", "10.0.0.2:7946")), "x:1") is None


def _frame(msg: Ping) -> bytes:
    from mesh.codec import seal_frame

    return seal_frame(encode_message(msg), None)


def test_malformed_input_is_dropped_and_counted() -> None:
    swim = Swim(LAN.with_(node_name="me"), addr="10.0.0.1:7946", now=0.0, rng=random.Random(1))
    v = bytes([PROTOCOL_VERSION])
    for junk in (b"", v, b"\x07\x01", v + b"\x06\x00", bytes(2000), v + b"\x0b" + bytes(40)):
        swim.handle_packet(1.0, junk, "10.0.0.2:7946")
    assert swim.handle_stream(1.0, v + b"\x08\x00\x00\x00\x05abc", "x:1") is None
    m = swim.metrics()
    assert m.malformed_packets == 6 and m.decrypt_failures == 1
    assert [x.name for x in swim.members()] == ["me"]


def test_relay_state_is_bounded_under_a_ping_req_flood() -> None:
    swim = Swim(LAN.with_(node_name="me"), addr="10.0.0.1:7946", now=0.0, rng=random.Random(1))
    flood = packet(*[IndirectPing(i, "t", "10.0.0.3:7946", True, "x", "10.0.0.2:7946") for i in range(20)])
    for _ in range(60):
        swim.handle_packet(0.1, flood, "10.0.0.2:7946")
    m = swim.metrics()
    assert m.malformed_packets == 0
    assert m.relays_dropped == 60 * 20 - MAX_PENDING_ACKS
    swim.handle_timer(10.0)  # relays time out (and nack) and free their slots
    swim.handle_packet(10.0, packet(IndirectPing(1, "t", "10.0.0.3:7946", True, "x", "10.0.0.2:7946")), "x:1")
    assert swim.metrics().relays_dropped == m.relays_dropped


def test_packets_never_exceed_the_size_limit() -> None:
    swim = Swim(LAN.with_(node_name="me"), addr="10.0.0.1:7946", now=0.0, rng=random.Random(1))
    meta = NodeMeta.create(http_addr="10.0.0.1:8080", version="1.0", roles={"zone": "z" * 100})
    for i in range(300):
        swim.handle_packet(0.0, packet(Alive(1, f"node-{i:03}", f"10.1.{i // 250}.{i % 250}:7946", meta)), "x:1")
    sizes = []
    now = 0.0
    for _ in range(500):
        now = swim.next_deadline() or now
        swim.handle_timer(now)
        for action in swim.drain_actions():
            if isinstance(action, SendPacket):
                sizes.append(len(action.data))
            elif isinstance(action, StreamRequest):
                swim.handle_stream_reply(now, action.token, None)
    assert len(sizes) > 100 and max(sizes) <= MAX_PACKET_BYTES
    assert max(sizes) > MAX_PACKET_BYTES - 300  # compound packets are actually filled


class _BigState:
    def __init__(self, size: int) -> None:
        self.size = size
        self.merged: list[int] = []

    def local_state(self, join: bool) -> bytes:
        return bytes(self.size)

    def merge_remote_state(self, state: bytes, join: bool) -> None:
        self.merged.append(len(state))

    def get_broadcasts(self, overhead: int, limit: int) -> list[bytes]:
        return [b"x" * 5000, b"ok"]  # the first is over MAX_USER_MSG_BYTES and must be skipped

    def notify_msg(self, msg: bytes) -> None:
        assert msg == b"ok"


def test_a_misbehaving_delegate_cannot_break_membership() -> None:
    net = SimNetwork(3)
    big, small = _BigState(5 * 1024 * 1024), _BigState(10)
    a = net.add_node(LAN, delegate=big)
    b = net.add_node(LAN, delegate=small)
    net.join(b, [a])
    assert net.run_until_true(net.converged, timeout_s=5)
    assert 0 in small.merged  # a's oversized state was left out, the membership still merged
    assert 10 in big.merged
    net.run_for(5)
    assert a.swim.metrics().malformed_packets == 0 and b.swim.metrics().malformed_packets == 0


def test_a_late_leave_turns_a_failure_verdict_into_left() -> None:
    # The leaver's own message can arrive after the others declared it dead (seen with real processes when
    # the few transmissions of a leave were lost): the graceful departure must still win.
    net, nodes = cluster(3)
    a, b, leaver = nodes
    inc = leaver.swim.incarnation
    net.crash(leaver)
    assert net.run_until_true(lambda: net.all_see(leaver.name, {DEAD}, [a, b]), timeout_s=60)
    net.inject(a, packet(Dead(inc, leaver.name, leaver.name)), leaver.addr)
    assert a.swim.member(leaver.name).state == LEFT  # type: ignore[union-attr]
    assert net.run_until_true(lambda: net.all_see(leaver.name, {LEFT}, [a, b]), timeout_s=10)
    # A failure certificate never downgrades it again.
    net.inject(b, packet(Dead(inc, leaver.name, a.name)), a.addr)
    assert b.swim.member(leaver.name).state == LEFT  # type: ignore[union-attr]


def test_members_leaving_together_finish_as_soon_as_nobody_is_left_to_tell() -> None:
    # serve --processes N after its supervisor is killed: every process leaves at once. Gossip never targets
    # a member that left, so the last transmissions of each leave had nowhere to go and every leave ran
    # out leave_timeout_s (5 s) before; now a leave is complete once every other member is gone.
    net, nodes = cluster(4)
    for node in nodes:
        net.leave(node)
    start = net.now
    assert net.run_until_true(lambda: all(n.swim.leave_complete for n in nodes), timeout_s=LAN.leave_timeout_s)
    assert net.now - start < 1.0  # measured 0.75 s (a few gossip rounds); before: never, the timeout cut it


def test_a_leave_still_waits_for_its_gossip_while_a_member_is_alive() -> None:
    net, nodes = cluster(3)
    net.leave(nodes[0])
    assert not nodes[0].swim.leave_complete  # nodes 1 and 2 are alive: they must hear it first
    assert net.run_until_true(lambda: nodes[0].swim.leave_complete, timeout_s=5)
    assert net.all_see(nodes[0].name, {LEFT}, nodes[1:])
