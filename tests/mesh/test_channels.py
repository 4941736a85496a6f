"""Channels multiplex application delegates over the mesh's one slot; the best-effort channel spreads,
deduplicates, relays and stays bounded."""

from __future__ import annotations

import struct

from hypothesis import given
from hypothesis import strategies as st

from mesh.best_effort import BestEffortBroadcast
from mesh.channels import MAX_CHANNEL_MSG_BYTES, Channels
from mesh.delegate import NullDelegate


class Recorder(NullDelegate):
    def __init__(self, state: bytes = b"", outgoing: list[bytes] | None = None) -> None:
        self.state = state
        self.outgoing = outgoing or []
        self.merged: list[bytes] = []
        self.msgs: list[bytes] = []

    def local_state(self, join: bool) -> bytes:
        return self.state

    def merge_remote_state(self, state: bytes, join: bool) -> None:
        self.merged.append(state)

    def get_broadcasts(self, overhead: int, limit: int) -> list[bytes]:
        out, used = [], 0
        while self.outgoing and used + overhead + len(self.outgoing[0]) <= limit:
            msg = self.outgoing.pop(0)
            out.append(msg)
            used += overhead + len(msg)
        return out

    def notify_msg(self, msg: bytes) -> None:
        self.msgs.append(msg)


@given(st.binary(max_size=300), st.binary(max_size=300))
def test_states_and_messages_reach_their_own_channel(a_state: bytes, b_state: bytes) -> None:
    src_a, src_b = Recorder(a_state, [b"a1", b"a2"]), Recorder(b_state, [b"b1"])
    sender = Channels()
    sender.attach(1, src_a)
    sender.attach(2, src_b)
    dst_a, dst_b = Recorder(), Recorder()
    receiver = Channels()
    receiver.attach(1, dst_a)
    receiver.attach(2, dst_b)
    receiver.merge_remote_state(sender.local_state(False), False)
    assert dst_a.merged == ([a_state] if a_state else []) and dst_b.merged == ([b_state] if b_state else [])
    for msg in sender.get_broadcasts(3, 1400):
        receiver.notify_msg(msg)
    assert dst_a.msgs == [b"a1", b"a2"] and dst_b.msgs == [b"b1"]


def test_first_channel_is_served_first_and_limits_hold() -> None:
    big = [bytes(500)] * 4
    first, second = Recorder(outgoing=list(big)), Recorder(outgoing=[b"hint"] * 10)
    ch = Channels()
    ch.attach(1, first)
    ch.attach(2, second)
    out = ch.get_broadcasts(2, 1200)
    assert sum(len(m) + 2 for m in out) <= 1200
    assert [m[0] for m in out][:2] == [1, 1], "the state channel goes first"


def test_garbage_is_counted_never_raised() -> None:
    target = Recorder()
    ch = Channels()
    ch.attach(1, target)
    ch.notify_msg(b"")
    ch.notify_msg(b"\x09whatever")
    ch.merge_remote_state(b"\x01\x00\x00\x00\xff" + b"short", False)  # claims 255 bytes
    ch.merge_remote_state(b"\x01\x00", False)
    ch.merge_remote_state(struct.pack(">BI", 7, 1) + b"x", False)  # unknown channel: skipped
    assert ch.malformed == 3 and ch.unknown == 2 and target.merged == [] and target.msgs == []


def test_attach_rejects_taken_and_bad_ids() -> None:
    ch = Channels()
    ch.attach(1, Recorder())
    for bad in (1, -1, 256):
        try:
            ch.attach(bad, Recorder())
        except ValueError:
            continue
        raise AssertionError(f"channel {bad} accepted")


def _flood(nodes: list[BestEffortBroadcast], rounds: int) -> None:
    """Every node gossips each round to every other (a small complete graph)."""
    for _ in range(rounds):
        for i, node in enumerate(nodes):
            for j, other in enumerate(nodes):
                if i != j:
                    for msg in node.get_broadcasts(2, 1400):
                        other.notify_msg(msg)


def test_best_effort_reaches_everyone_once_and_relays() -> None:
    got: list[list[bytes]] = [[] for _ in range(4)]
    nodes = [BestEffortBroadcast(got[i].append, retransmit_mult=2, cluster_size=lambda: 4) for i in range(4)]
    assert nodes[0].publish(b"hello")
    # Node 0 sends only to node 1; node 1's relay must carry it to 2 and 3.
    for msg in nodes[0].get_broadcasts(2, 1400):
        nodes[1].notify_msg(msg)
    for msg in nodes[1].get_broadcasts(2, 1400):
        nodes[2].notify_msg(msg)
        nodes[3].notify_msg(msg)
    _flood(nodes, 5)
    assert got == [[], [b"hello"], [b"hello"], [b"hello"]], "delivered exactly once, never to the origin"
    assert all(n.queued == 0 for n in nodes), "sent enough, then forgotten"


def test_best_effort_is_bounded_and_refuses_oversized() -> None:
    node = BestEffortBroadcast(lambda _m: None, max_queued=10)
    for i in range(100):
        node.publish(b"m%d" % i)
    assert node.queued == 10
    assert not node.publish(bytes(MAX_CHANNEL_MSG_BYTES + 1)) and not node.publish(b"")
