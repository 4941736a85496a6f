"""Rate-limit counters: sums over live nodes, window rollover, expiry, exact big counts, restarts."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mesh.state import ClusterState
from mesh.state_config import COUNTER_TABLE
from tests.mesh.test_state_helpers import Bench


def test_global_count_is_the_sum_of_every_live_nodes_shard() -> None:
    bench = Bench(("a", "b", "c"))
    bench.tick()
    now = 1_000.5  # epoch 100 of a 10 s window
    for name, amount in (("a", 3), ("b", 4), ("c", 5)):
        bench.nodes[name].incr("tenant", 10.0, now, amount)
    assert bench.nodes["a"].count("tenant", 10.0, now) == 3  # nothing published yet: only our own
    bench.tick(0.0)  # flush
    bench.gossip(rounds=4)
    assert all(s.count("tenant", 10.0, now) == 12 for s in bench.live)
    assert bench.nodes["b"].incr("tenant", 10.0, now) == 13  # incr returns the new global count
    bench.down.add("c")  # a dead node's shard leaves the sum at once
    bench.tick(0.0)
    assert bench.nodes["a"].count("tenant", 10.0, now) == 7


def test_windows_roll_over_and_expired_ones_are_collected() -> None:
    bench = Bench(("a", "b"))
    a, b = bench.nodes["a"], bench.nodes["b"]
    a.incr("k", 1.0, 500.2, 5)
    b.incr("k", 1.0, 500.4, 2)
    a.tick(500.5)
    b.tick(500.5)
    bench.gossip(rounds=3)
    assert a.count("k", 1.0, 500.9) == 7
    assert a.count("k", 1.0, 501.0) == 0  # next epoch: nobody counted yet
    assert a.incr("k", 1.0, 501.1) == 1  # a new window starts from zero, b's old epoch is ignored
    a.tick(501.2)
    b.tick(501.2)  # b drops its expired window from its row
    bench.gossip(rounds=3)
    shard_values = [v for doc in b.doc_names() if doc.startswith("r/~counters/") for v in b.doc_values(doc).values()]
    stored = [json.loads(v) for v in shard_values]
    assert {"k\x1f1000": [501, "1"]} in stored  # a's new window, count as a string
    assert all(row != {"k\x1f1000": [500, "2"]} for row in stored)  # b's expired one is gone
    assert a.count("k", 1.0, 501.5) == 1


def test_windows_of_one_key_are_independent() -> None:
    state = ClusterState("a")
    state.incr("k", 1.0, 10.0)
    state.incr("k", 60.0, 10.0, 10)
    assert (state.count("k", 1.0, 10.5), state.count("k", 60.0, 10.5)) == (1, 10)


def test_counts_beyond_float_precision_stay_exact() -> None:
    bench = Bench(("a", "b"))
    big = 2**80 + 1
    bench.nodes["a"].incr("k", 3600.0, 10.0, big)
    bench.nodes["a"].tick(10.0)
    bench.gossip(rounds=3)
    assert bench.nodes["b"].count("k", 3600.0, 10.0) == big


def test_a_restarted_node_adopts_its_previous_shard_by_max() -> None:
    bench = Bench(("a", "b"))
    bench.nodes["a"].incr("k", 100.0, 10.0, 40)
    bench.nodes["a"].tick(10.0)
    bench.gossip(rounds=3)
    fresh = bench.restart("a")
    fresh.incr("k", 100.0, 11.0, 2)  # counted before it synced
    bench.push_pull("a", "b", join=True)
    assert fresh.count("k", 100.0, 12.0) == 40  # max(40, 2): the same node's two versions merge by max
    fresh.incr("k", 100.0, 12.0)
    fresh.tick(12.0)
    bench.gossip(rounds=3)
    assert bench.nodes["b"].count("k", 100.0, 12.0) == 41


def test_shards_of_dead_nodes_are_deleted_after_the_gc_delay() -> None:
    bench = Bench(("a", "b", "c"), Bench(()).config.with_(dead_gc_delay_s=2.0, housekeeping_interval_s=0.5))
    bench.tick()
    bench.nodes["c"].incr("k", 1e6, bench.now, 9)
    bench.tick()
    bench.gossip(rounds=3)
    assert "c" in bench.nodes["a"].rows(COUNTER_TABLE)
    bench.down.add("c")
    for _ in range(16):
        bench.tick()
        bench.gossip(rounds=1)
    assert all("c" not in s.rows(COUNTER_TABLE) for s in bench.live)


def test_bad_counter_arguments_are_refused() -> None:
    state = ClusterState("a")
    for args in (("", 1.0), ("k", 0.0), ("a\x1fb", 1.0)):
        with pytest.raises(ValueError):
            state.incr(args[0], args[1], 0.0)
    with pytest.raises(ValueError):
        state.incr("k", 1.0, 0.0, -1)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 1000), st.floats(0, 29.99)), max_size=30))
def test_sum_matches_the_increments_of_the_current_window(incrs: list[tuple[int, int, float]]) -> None:
    bench = Bench(("a", "b", "c"))
    names = ("a", "b", "c")
    for node, amount, offset in sorted(incrs, key=lambda t: t[2]):
        bench.nodes[names[node]].incr("k", 10.0, 3_000.0 + offset, amount)
    for state in bench.live:
        state.tick(3_029.99, names)
    bench.gossip(rounds=4)
    expected = sum(amount for _, amount, offset in incrs if offset >= 20.0)
    assert all(s.count("k", 10.0, 3_029.99) == expected for s in bench.live)
