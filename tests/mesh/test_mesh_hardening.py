"""Hostile input to the sans-IO core: forged incarnations, junk members, and any bytes at all.

The network here is the simulator (mesh/sim.py) or bytes fed straight into ``Swim``; the same rules under a
real node's sockets are in chaos/test_hardening.py.
"""

from __future__ import annotations

import logging
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mesh.codec import compound, decode_messages, encode_message, open_frame, open_packet, seal_frame, seal_packet
from mesh.config import MeshConfig
from mesh.errors import DecodeError, RemoteProtocolError
from mesh.limits import MAX_ACCUSED_INCARNATION, MAX_INCARNATION_JUMP, MAX_U32
from mesh.member import Member, MemberState, NodeMeta, check_member_addr
from mesh.messages import Alive, Dead, Message, MessageType, PushPull, PushPullMember, Suspect
from mesh.sim import SimNetwork, SimNode
from mesh.swim import Swim
from mesh.wire_pb import mesh_pb2 as pb

LAN = MeshConfig.lan()
ALIVE, SUSPECT, DEAD = MemberState.ALIVE, MemberState.SUSPECT, MemberState.DEAD
FORGER = "10.66.6.6:7946"
META = NodeMeta.create(http_addr="10.0.0.7:8000", version="1.2.3", roles={"zone": "a"})


def cluster(n: int, seed: int = 1) -> tuple[SimNetwork, list[SimNode]]:
    net = SimNetwork(seed)
    nodes = net.cluster(n, LAN)
    assert net.run_until_true(net.converged, timeout_s=60)
    return net, nodes


def packet(*msgs: Message) -> bytes:
    return seal_packet(compound([encode_message(m) for m in msgs]), None)


def never_gone(net: SimNetwork, observers: list[SimNode], name: str, duration_s: float) -> bool:
    """``name`` is never dead (nor left) in any observer's view for ``duration_s`` simulated seconds."""
    step = LAN.gossip_interval_s
    end = net.now + duration_s
    while net.now < end:
        net.run_for(step)
        for node in observers:
            member = node.swim.member(name)
            if member is None or member.state.is_gone:
                return False
    return True


# -- forged incarnations ----------------------------------------------------------------------------------


def test_a_forged_death_at_the_largest_incarnation_evicts_no_one_and_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    net, nodes = cluster(3)
    victim = nodes[1]
    caplog.set_level(logging.WARNING, logger="mesh")
    for node in nodes:  # victim included: it must not out-bid itself into the ceiling
        net.inject(node, packet(Dead(MAX_U32, victim.name, "n9")), FORGER)
    assert never_gone(net, nodes, victim.name, 40.0)  # before: dead everywhere for 20-40 s
    assert all(n.swim.metrics().incarnations_refused >= 1 for n in nodes)
    assert victim.swim.incarnation < MAX_ACCUSED_INCARNATION
    assert any("implausible incarnation refused" in r.getMessage() and FORGER in r.getMessage() for r in caplog.records)


def test_a_forged_jump_is_refused_and_a_plausible_accusation_is_refuted() -> None:
    net, nodes = cluster(3)
    victim, other = nodes[1], nodes[2]
    known = other.swim.member(victim.name).incarnation  # type: ignore[union-attr]
    net.inject(other, packet(Suspect(known + MAX_INCARNATION_JUMP + 1, victim.name, "n9")), FORGER)
    assert other.swim.member(victim.name).state == ALIVE  # type: ignore[union-attr]
    assert other.swim.metrics().incarnations_refused == 1
    # An accusation a real prober could make (a few steps ahead) is accepted -- and the victim refutes it.
    accused = known + 3
    for node in nodes:
        net.inject(node, packet(Dead(accused, victim.name, "n9")), FORGER)
    assert net.run_until_true(lambda: net.all_see(victim.name, {ALIVE}), timeout_s=5)
    assert victim.swim.incarnation > accused
    assert all(n.swim.member(victim.name).incarnation == victim.swim.incarnation for n in nodes)  # type: ignore[union-attr]


def test_a_forged_huge_alive_cannot_pin_a_member() -> None:
    net, nodes = cluster(3)
    victim = nodes[1]
    forged = Alive(MAX_U32, victim.name, victim.addr, NodeMeta.create(http_addr="10.66.6.6:80"))
    for node in nodes:
        net.inject(node, packet(forged), FORGER)
    net.update_meta(victim, META)  # the member's own next change must still win everywhere
    assert net.run_until_true(
        lambda: all(n.swim.member(victim.name).meta == META for n in nodes),  # type: ignore[union-attr]
        timeout_s=5,
    )


def test_a_restarted_member_still_refutes_its_previous_life() -> None:
    net, nodes = cluster(3)
    phoenix = nodes[2]
    for _ in range(5):  # a few refutations: its incarnation is now ahead of a fresh start's
        net.inject(phoenix, packet(Suspect(phoenix.swim.incarnation, phoenix.name, "n0")), nodes[0].addr)
        net.run_for(1)
    before = nodes[0].swim.member(phoenix.name).incarnation  # type: ignore[union-attr]
    assert before > 2
    net.crash(phoenix)
    net.restart(phoenix, LAN, [nodes[0]])  # incarnation starts over at 1; the cluster remembers `before`
    assert net.run_until_true(net.converged, timeout_s=10)
    assert phoenix.swim.incarnation > before


# -- junk members -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "addr",
    ["host:7946", "10.0.0.1:0", "10.0.0.1:65536", "0.0.0.0:7946", "224.0.0.1:7946", "255.255.255.255:7946",
     "::1:7946", "[10.0.0.1]:7946", "[::]:7946", "10.0.0.1 :7946", "1e1.0.0.1:7946"],
)  # fmt: skip
def test_an_alive_at_an_address_we_cannot_probe_is_refused(addr: str) -> None:
    raw = encode_message(Alive(1, "junk", "10.0.0.1:7946", NodeMeta())).replace(b"10.0.0.1:7946", addr.encode())
    raw = raw.replace(b"\x1a" + bytes([len("10.0.0.1:7946")]), b"\x1a" + bytes([len(addr.encode())]))  # its length
    with pytest.raises(DecodeError, match="address"):
        decode_messages(raw)


def test_ip_literals_are_member_addresses() -> None:
    for addr in ("10.0.0.1:7946", "127.0.0.5:1", "[::1]:7946", "[fe80::1]:65535"):
        check_member_addr(addr)
        assert decode_messages(encode_message(Alive(1, "n", addr, NodeMeta())))[0] == Alive(1, "n", addr, NodeMeta())


@pytest.mark.parametrize("name", ["a\nb", "bell\x07", "tab\there", "\x00", "line\u2028sep", "nbsp\u00a0"])
def test_unprintable_names_and_labels_are_refused(name: str) -> None:
    body = pb.Alive(incarnation=1, node=name, addr="10.0.0.1:794", meta=pb.NodeMeta(http_addr="", version=""))
    alive = bytes([MessageType.ALIVE]) + body.SerializeToString()
    with pytest.raises(DecodeError, match="unprintable"):
        decode_messages(alive)
    with pytest.raises(ValueError, match="unprintable"):
        NodeMeta.create(roles={"zone": name})


def test_truncated_and_mutated_alives_never_make_junk_members() -> None:
    """Before: 219 of 20,000 mutations became members, e.g. 'peer\\t1' or '127.0.0.U:7946'."""
    valid = packet(Alive(3, "peer-1", "10.0.0.2:7946", META))
    rng = random.Random(7)
    swim = fresh()
    for _ in range(5_000):
        data = bytearray(valid)
        if rng.random() < 0.5:
            data = data[: rng.randrange(len(data))] + rng.randbytes(rng.randrange(8))
        else:
            for _ in range(rng.randint(1, 3)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        swim.handle_packet(1.0, bytes(data), FORGER)
    for member in swim.members():
        assert well_formed(member), member
    assert swim.metrics().malformed_packets > 0


# -- any bytes (hypothesis) ---------------------------------------------------------------------------------


def fresh() -> Swim:
    swim = Swim(LAN.with_(node_name="me"), addr="10.0.0.1:7946", now=0.0, rng=random.Random(1))
    swim.drain_actions()
    return swim


def well_formed(member: Member) -> bool:
    try:
        check_member_addr(member.addr)
    except ValueError:
        return False
    texts = (member.name, member.meta.http_addr, member.meta.version, *(s for kv in member.meta.roles for s in kv))
    return bool(member.name) and all(t.isprintable() for t in texts)


def valid_names(decoded: list[Message] | Message) -> set[str]:
    msgs = decoded if isinstance(decoded, list) else [decoded]
    out = {m.node for m in msgs if isinstance(m, Alive)}
    for m in msgs:
        if isinstance(m, PushPull):
            out |= {r.name for r in m.members if r.state == ALIVE}
    return out


names = st.sampled_from(["peer-1", "peer-2", "me", "x"]) | st.text(max_size=8)
addrs = st.sampled_from(["10.0.0.2:7946", "10.0.0.1:7946", "[::1]:7946"]) | st.text(max_size=16)
messages = st.one_of(
    st.builds(Alive, st.integers(0, MAX_U32), st.sampled_from(["peer-1", "peer-2", "me"]), st.just("10.0.0.2:7946"),
              st.just(META)),
    st.builds(Suspect, st.integers(0, MAX_U32), st.sampled_from(["peer-1", "me"]), st.just("peer-2")),
    st.builds(Dead, st.integers(0, MAX_U32), st.sampled_from(["peer-1", "me"]), st.just("peer-2")),
)  # fmt: skip


def mutated(data: st.DataObject, raw: bytes) -> bytes:
    """``raw`` truncated, extended, or with some bytes replaced."""
    buf = bytearray(raw)
    for _ in range(data.draw(st.integers(0, 4))):
        op = data.draw(st.sampled_from(["cut", "flip", "append"]))
        if op == "cut" and buf:
            del buf[data.draw(st.integers(0, len(buf) - 1)) :]
        elif op == "flip" and buf:
            buf[data.draw(st.integers(0, len(buf) - 1))] = data.draw(st.integers(0, 255))
        else:
            buf += data.draw(st.binary(max_size=16))
    return bytes(buf)


def check_fed(swim: Swim, data: bytes, decoded: list[Message] | Message | None, before: set[str]) -> None:
    """After feeding ``data``: every member is well formed, and new ones were named by a valid message in it."""
    members = swim.members()
    for member in members:
        assert well_formed(member), member
    added = {m.name for m in members} - before
    if added:
        assert decoded is not None, f"undecodable input added {added}"
        assert added <= valid_names(decoded), (added, decoded)


def decode_packet(data: bytes) -> list[Message] | None:
    try:
        return open_packet(data, None)
    except RemoteProtocolError:
        return None


def decode_frame(data: bytes) -> Message | None:
    try:
        return open_frame(data, None)
    except RemoteProtocolError:
        return None


#: A few hundred cases by default (seconds); thousands under `-m slow`.
EXAMPLES = [300, pytest.param(5_000, marks=pytest.mark.slow)]


def fuzz(examples: int) -> settings:
    return settings(max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("examples", EXAMPLES)
def test_any_bytes_as_a_packet_or_a_stream_never_raise_nor_add_a_member(examples: int) -> None:
    @fuzz(examples)
    @given(st.binary(max_size=1500))
    def run(data: bytes) -> None:
        swim = fresh()
        swim.handle_packet(1.0, data, FORGER)
        check_fed(swim, data, decode_packet(data), {"me"})
        reply = swim.handle_stream(1.0, data, FORGER)
        assert reply is None or open_frame(reply, None) is not None
        check_fed(swim, data, decode_frame(data), {"me"})

    run()


@pytest.mark.parametrize("examples", EXAMPLES)
def test_mutated_valid_packets_never_raise_nor_make_junk_members(examples: int) -> None:
    @fuzz(examples)
    @given(st.lists(messages, min_size=1, max_size=4), st.data())
    def run(msgs: list[Message], data: st.DataObject) -> None:
        swim = fresh()
        raw = mutated(data, packet(*msgs))
        swim.handle_packet(1.0, raw, FORGER)
        check_fed(swim, raw, decode_packet(raw), {"me"})
        me = swim.member("me")
        assert me is not None and me.state == ALIVE  # no accusation, however forged, makes us give up
        assert swim.incarnation <= MAX_ACCUSED_INCARNATION + 1

    run()


push_pull_members = st.lists(
    st.builds(PushPullMember, names.filter(bool), addrs, st.just(META), st.integers(0, MAX_U32),
              st.sampled_from(MemberState)),
    max_size=4,
)  # fmt: skip


@pytest.mark.parametrize("examples", EXAMPLES)
def test_mutated_push_pulls_never_raise_nor_make_junk_members(examples: int) -> None:
    @fuzz(examples)
    @given(push_pull_members, st.data())
    def run(members: list[PushPullMember], data: st.DataObject) -> None:
        swim = fresh()
        try:
            raw = seal_frame(encode_message(PushPull(False, tuple(members), b"")), None)
        except ValueError:  # a name or address too long to encode at all
            return
        raw = mutated(data, raw)
        swim.handle_stream(1.0, raw, FORGER)
        check_fed(swim, raw, decode_frame(raw), {"me"})
        assert swim.member("me").state == ALIVE  # type: ignore[union-attr]

    run()
