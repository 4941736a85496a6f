"""The small pure pieces: Lifeguard math, the broadcast queue, timers, config profiles."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mesh.awareness import Awareness
from mesh.broadcast import BroadcastQueue, retransmit_limit
from mesh.config import MeshConfig
from mesh.limits import MAX_BROADCAST_QUEUE
from mesh.suspicion import Suspicion, remaining_suspicion_time, suspicion_timeout
from mesh.swim import push_pull_scale
from mesh.timers import Timers

# -- Lifeguard: local health awareness --


def test_awareness_is_bounded_and_scales_timeouts() -> None:
    a = Awareness(8)
    assert a.scale(0.5) == 0.5
    a.apply_delta(3)
    assert a.scale(0.5) == 2.0
    a.apply_delta(100)
    assert a.score == 7 and a.scale(1.0) == 8.0  # capped at the max multiplier
    a.apply_delta(-100)
    assert a.score == 0
    off = Awareness(1)
    off.apply_delta(5)
    assert off.scale(1.0) == 1.0


# -- Lifeguard: dynamic suspicion --


def test_suspicion_timeout_scales_with_log10_of_cluster_size() -> None:
    assert suspicion_timeout(4, 1, 1.0) == 4.0
    assert suspicion_timeout(4, 10, 1.0) == 4.0
    assert suspicion_timeout(4, 100, 1.0) == pytest.approx(8.0)
    assert suspicion_timeout(4, 1000, 0.2) == pytest.approx(2.4)


def test_remaining_suspicion_time_matches_memberlist() -> None:
    # memberlist's suspicion_test.go table: k=3, min=2s, max=30s.
    cases = [
        (0, 0.0, 30.0),
        (1, 2.0, 14.0),
        (2, 3.0, 4.810371),
        (3, 4.0, -2.0),
        (4, 5.0, -3.0),
        (5, 10.0, -8.0),
    ]
    for n, elapsed, expected in cases:
        assert remaining_suspicion_time(n, 3, elapsed, 2.0, 30.0) == pytest.approx(expected, abs=1e-3)


@given(st.integers(1, 10), st.floats(0.1, 10), st.integers(1, 8))
def test_suspicion_deadline_shrinks_monotonically_to_min(k: int, min_s: float, mult: int) -> None:
    max_s = mult * min_s
    s = Suspicion("accuser", k, min_s, max_s, start=100.0)
    assert s.deadline() == pytest.approx(100.0 + max_s)
    previous = s.deadline()
    for i in range(k + 3):
        s.confirm(f"peer{i}")
        assert s.deadline() <= previous + 1e-9
        previous = s.deadline()
    assert s.deadline() == pytest.approx(100.0 + min_s)


def test_suspicion_counts_each_independent_accuser_once() -> None:
    s = Suspicion("a", 3, 1.0, 6.0, start=0.0)
    assert not s.confirm("a")  # the original accuser gossiped back to us
    assert s.confirm("b")
    assert not s.confirm("b")
    assert s.confirm("c") and s.confirm("d")
    assert not s.confirm("e")  # k reached: nothing more to gain
    assert s.confirmations == 3
    assert Suspicion("a", 0, 2.0, 12.0, start=1.0).deadline() == 3.0  # k = 0: nobody can confirm


# -- dissemination --


def test_retransmit_limit() -> None:
    assert [retransmit_limit(4, n) for n in (1, 3, 9, 10, 99, 200)] == [4, 4, 4, 8, 8, 12]


def test_broadcast_queue_retransmits_each_message_exactly_the_limit() -> None:
    q = BroadcastQueue(retransmit_mult=2)
    q.queue(b"x" * 10, name="a")
    sent = 0
    for _ in range(10):
        sent += len(q.get(2, 1000, n=5, max_count=64))
    assert sent == retransmit_limit(2, 5) and len(q) == 0


def test_newer_update_about_a_member_replaces_the_older() -> None:
    done: list[str] = []
    q = BroadcastQueue(4)
    q.queue(b"suspect-a", name="a", on_done=lambda: done.append("old"))
    q.queue(b"other", name="b")
    q.queue(b"alive-a", name="a")
    assert done == ["old"]
    assert sorted(q.get(0, 1000, n=5, max_count=64)) == [b"alive-a", b"other"]


def test_broadcast_queue_prefers_fresh_messages_and_respects_limits() -> None:
    q = BroadcastQueue(4)
    q.queue(b"1" * 100)
    q.get(0, 1000, n=5, max_count=64)  # now transmitted once
    q.queue(b"2" * 100)
    q.queue(b"3" * 100)
    assert q.get(0, 250, n=5, max_count=64) == [b"3" * 100, b"2" * 100]  # newest, fewest transmits first
    # All three were sent once now: the newest goes first; 100 bytes + 2 of overhead fit in 102, not 101.
    assert q.get(2, 102, n=5, max_count=64) == [b"3" * 100]
    assert q.get(2, 101, n=5, max_count=64) == []
    assert len(q.get(0, 10_000, n=5, max_count=2)) == 2


def test_broadcast_queue_is_bounded() -> None:
    finished: list[int] = []
    q = BroadcastQueue(4)

    def done(i: int) -> Callable[[], None]:
        return lambda: finished.append(i)

    for i in range(MAX_BROADCAST_QUEUE + 10):
        q.queue(str(i).encode(), on_done=done(i))
    assert len(q) == MAX_BROADCAST_QUEUE
    assert sorted(finished) == list(range(10))  # the oldest were dropped


def test_push_pull_interval_scales_past_32_members() -> None:
    assert push_pull_scale(30.0, 32) == 30.0
    assert push_pull_scale(30.0, 33) == 60.0
    assert push_pull_scale(30.0, 64) == 60.0
    assert push_pull_scale(30.0, 200) == 120.0


# -- timers --


def test_timers_fire_in_order_and_can_be_cancelled() -> None:
    t = Timers()
    fired: list[tuple[str, float]] = []
    t.call_at(2.0, lambda now: fired.append(("b", now)))
    a = t.call_at(1.0, lambda now: fired.append(("a", now)))

    def schedule_nested(now: float) -> None:
        t.call_at(1.7, lambda n: fired.append(("nested", n)))

    t.call_at(1.5, schedule_nested)
    c = t.call_at(1.8, lambda now: fired.append(("c", now)))
    c.cancel()
    assert t.next_deadline() == 1.0
    assert a is not None
    assert t.fire_due(0.5) == 0
    t.fire_due(3.0)
    assert [name for name, _ in fired] == ["a", "nested", "b"]
    assert t.next_deadline() is None


# -- config --


def test_profiles_carry_memberlist_values() -> None:
    lan, wan, local = MeshConfig.lan(), MeshConfig.wan(), MeshConfig.local()
    assert (lan.probe_interval_s, lan.probe_timeout_s, lan.indirect_checks, lan.suspicion_mult) == (
        1.0,
        0.5,
        3,
        4,
    )
    assert (lan.suspicion_max_timeout_mult, lan.awareness_max_multiplier, lan.gossip_nodes) == (6, 8, 3)
    assert (lan.gossip_interval_s, lan.retransmit_mult, lan.push_pull_interval_s) == (0.2, 4, 30.0)
    assert lan.dead_node_reclaim_time_s == 0.0
    assert (wan.probe_interval_s, wan.probe_timeout_s, wan.suspicion_mult, wan.gossip_nodes) == (
        5.0,
        3.0,
        6,
        4,
    )
    assert (local.probe_timeout_s, local.indirect_checks, local.suspicion_mult) == (0.2, 1, 3)
    assert (local.gossip_interval_s, local.push_pull_interval_s) == (0.1, 15.0)
    assert MeshConfig.local(indirect_checks=2).indirect_checks == 2


def test_every_field_has_help_and_a_unit_where_it_is_a_time() -> None:
    for f in dataclasses.fields(MeshConfig):
        assert f.metadata.get("help"), f.name
        if f.type in ("float",):
            assert f.name.endswith("_s"), f.name


def test_config_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="probe_timeout_s"):
        MeshConfig.lan(probe_timeout_s=2.0)
    with pytest.raises(ValueError, match="gossip_interval_s"):
        MeshConfig.lan(gossip_interval_s=0)
    with pytest.raises(ValueError, match="suspicion_mult"):
        MeshConfig.lan(suspicion_mult=0)
    with pytest.raises(ValueError, match="bind_port"):
        MeshConfig.lan(bind_port=70000)


def test_without_lifeguard_turns_off_exactly_lifeguard() -> None:
    off = MeshConfig.lan().without_lifeguard()
    assert (off.awareness_max_multiplier, off.suspicion_max_timeout_mult, off.buddy_system) == (1, 1, False)
    assert off.probe_interval_s == 1.0 and off.indirect_checks == 3
    assert math.isclose(off.probe_timeout_s, 0.5)
