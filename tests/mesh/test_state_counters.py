"""Rate-limit counters: sums over live nodes, window rollover, expiry, exact big counts, restarts."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mesh.state import ClusterState
from mesh.state.config import COUNTER_TABLE, StateConfig
from mesh.state.values import StateLimitError
from tests.mesh.test_state_helpers import Bench


def test_global_count_is_the_sum_of_every_live_nodes_shard() -> None:
    bench = Bench(("a", "b", "c"))
    bench.tick()
    now = 1_000.5  # epoch 100 of a 10 s window
    for name, amount in (("a", 3), ("b", 4), ("c", 5)):
        bench.nodes[name].incr("tenant", "rpm", 10.0, now, amount)
    assert bench.nodes["a"].count("tenant", "rpm", 10.0, now) == 3  # nothing published yet: only our own
    bench.tick(0.0)  # flush
    bench.gossip(rounds=4)
    assert all(s.count("tenant", "rpm", 10.0, now) == 12 for s in bench.live)
    assert bench.nodes["b"].incr("tenant", "rpm", 10.0, now) == 13  # incr returns the new global count
    bench.down.add("c")  # a dead node's shard leaves the sum at once
    bench.tick(0.0)
    assert bench.nodes["a"].count("tenant", "rpm", 10.0, now) == 7


def test_windows_roll_over_and_expired_ones_are_collected() -> None:
    bench = Bench(("a", "b"))
    a, b = bench.nodes["a"], bench.nodes["b"]
    a.incr("k", "rpm", 1.0, 500.2, 5)
    b.incr("k", "rpm", 1.0, 500.4, 2)
    a.tick(500.5)
    b.tick(500.5)
    bench.gossip(rounds=3)
    assert a.count("k", "rpm", 1.0, 500.9) == 7
    assert a.count("k", "rpm", 1.0, 501.0) == 0  # next epoch: nobody counted yet
    assert a.incr("k", "rpm", 1.0, 501.1) == 1  # a new window starts from zero, b's old epoch is ignored
    a.tick(501.2)
    b.tick(501.2)  # b drops its expired window from its row
    bench.gossip(rounds=3)
    shard_values = [v for doc in b.doc_names() if doc.startswith("r/~counters/") for v in b.doc_values(doc).values()]
    stored = [json.loads(v) for v in shard_values]
    assert {"k\x1frpm\x1f1000": [501, "1"]} in stored  # a's new window, count as a string
    assert all(row != {"k\x1frpm\x1f1000": [500, "2"]} for row in stored)  # b's expired one is gone
    assert a.count("k", "rpm", 1.0, 501.5) == 1


def test_windows_of_one_key_are_independent() -> None:
    state = ClusterState("a")
    state.incr("k", "rpm", 1.0, 10.0)
    state.incr("k", "rpm", 60.0, 10.0, 10)
    assert (state.count("k", "rpm", 1.0, 10.5), state.count("k", "rpm", 60.0, 10.5)) == (1, 10)


def test_limits_of_one_key_and_window_are_independent_everywhere() -> None:
    # A tenant limited to 100 requests and to 10,000 tokens a minute: two counters, not one.
    bench = Bench(("a", "b"))
    a = bench.nodes["a"]
    a.incr("tenant", "requests", 60.0, 10.0)
    a.incr("tenant", "tokens", 60.0, 10.0, 750)
    a.tick(10.0)
    bench.gossip(rounds=3)
    for state in bench.live:
        assert state.count("tenant", "requests", 60.0, 10.0) == 1
        assert state.count("tenant", "tokens", 60.0, 10.0) == 750
    stored = {k for doc in a.doc_names() if doc.startswith("r/~counters/") for k in json.loads(a.doc_values(doc)["a"])}
    assert stored == {"tenant\x1frequests\x1f60000", "tenant\x1ftokens\x1f60000"}


def test_counts_beyond_float_precision_stay_exact() -> None:
    bench = Bench(("a", "b"))
    big = 2**80 + 1
    bench.nodes["a"].incr("k", "rpm", 3600.0, 10.0, big)
    bench.nodes["a"].tick(10.0)
    bench.gossip(rounds=3)
    assert bench.nodes["b"].count("k", "rpm", 3600.0, 10.0) == big


def test_a_restarted_node_adopts_its_previous_shard_by_max() -> None:
    bench = Bench(("a", "b"))
    bench.nodes["a"].incr("k", "rpm", 100.0, 10.0, 40)
    bench.nodes["a"].tick(10.0)
    bench.gossip(rounds=3)
    fresh = bench.restart("a")
    fresh.incr("k", "rpm", 100.0, 11.0, 2)  # counted before it synced
    bench.push_pull("a", "b", join=True)
    assert fresh.count("k", "rpm", 100.0, 12.0) == 40  # max(40, 2): the same node's two versions merge by max
    fresh.incr("k", "rpm", 100.0, 12.0)
    fresh.tick(12.0)
    bench.gossip(rounds=3)
    assert bench.nodes["b"].count("k", "rpm", 100.0, 12.0) == 41


def test_shards_of_dead_nodes_are_deleted_after_the_gc_delay() -> None:
    bench = Bench(("a", "b", "c"), Bench(()).config.with_(dead_gc_delay_s=2.0, housekeeping_interval_s=0.5))
    bench.tick()
    bench.nodes["c"].incr("k", "rpm", 1e6, bench.now, 9)
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
    for key, limit, window in (
        ("", "l", 1.0),
        ("k", "l", 0.0),
        ("a\x1fb", "l", 1.0),
        ("k", "", 1.0),
        ("k", "l\x1f", 1.0),
    ):
        with pytest.raises(ValueError):
            state.incr(key, limit, window, 0.0)
    with pytest.raises(ValueError):
        state.incr("k", "l" * 33, 1.0, 0.0)  # limit names are short: every counter field carries one
    with pytest.raises(ValueError):
        state.incr("k", "rpm", 1.0, 0.0, -1)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 1000), st.floats(0, 29.99)), max_size=30))
def test_sum_matches_the_increments_of_the_current_window(incrs: list[tuple[int, int, float]]) -> None:
    bench = Bench(("a", "b", "c"))
    names = ("a", "b", "c")
    for node, amount, offset in sorted(incrs, key=lambda t: t[2]):
        bench.nodes[names[node]].incr("k", "rpm", 10.0, 3_000.0 + offset, amount)
    for state in bench.live:
        state.tick(3_029.99, names)
    bench.gossip(rounds=4)
    expected = sum(amount for _, amount, offset in incrs if offset >= 20.0)
    assert all(s.count("k", "rpm", 10.0, 3_029.99) == expected for s in bench.live)


# -- capacity: one node counting thousands of keys --


def _janitor_chores(bench: Bench) -> None:
    """Give the janitor (a) both chores: a dead node's row to collect, and a bloated registry document."""
    bench.tick()
    bench.nodes["c"].set_row("health", {"ok": True})
    bench.gossip(rounds=4)
    bench.down.add("c")
    b = bench.nodes["b"]
    for i in range(8000):  # ~100 KB of registry churn, past max_doc_bytes
        bench.now += 0.001
        b.add("workers", f"w{i % 40}", {"i": i, "pad": "p" * 40}, bench.now)
    bench.gossip(rounds=4)
    bench.anti_entropy()


def _assert_chores_done(bench: Bench, before: int) -> None:
    a = bench.nodes["a"]
    assert all("c" not in s.rows("health") for s in bench.live)  # GC of the dead node's row ran
    gen = a.generation("g/workers")
    assert gen is not None and gen.number >= 1  # the janitor compacted the registry
    assert a.doc_sizes()["g/workers"] < before / 2


def test_5000_keys_on_one_node_are_refused_past_the_bound_and_housekeeping_keeps_running() -> None:
    # The default bounds, but GC and compaction soon (the smallest max_doc_bytes the default rows allow).
    config = StateConfig(dead_gc_delay_s=2.0, housekeeping_interval_s=0.5, max_doc_bytes=64 * 1024)
    bench = Bench(("a", "b", "c"), config)
    _janitor_chores(bench)
    before = bench.nodes["a"].doc_sizes()["g/workers"]
    a, b = bench.nodes["a"], bench.nodes["b"]
    accepted: list[str] = []
    refused = 0
    for i in range(5000):
        try:
            a.incr(f"tenant-{i}", "rpm", 3600.0, bench.now)
        except StateLimitError as exc:
            assert "max_counter_fields=2048" in str(exc)
            refused += 1
        else:
            accepted.append(f"tenant-{i}")
    assert len(accepted) == config.max_counter_fields and refused == 5000 - len(accepted)
    assert a.metrics().counters_refused == refused
    assert a.incr("tenant-0", "rpm", 3600.0, bench.now) == 2  # a counter already admitted keeps counting
    for _ in range(16):  # 4 s: past the dead node's GC delay, with housekeeping every 0.5 s
        bench.tick()
        bench.gossip(rounds=1)
    bench.anti_entropy()  # counter shards of 128 keys are bigger than a delta: push-pull carries them
    _assert_chores_done(bench, before)
    assert a.metrics().counter_flush_failures == 0
    assert b.count("tenant-0", "rpm", 3600.0, bench.now) == 2
    assert sum(b.count(key, "rpm", 3600.0, bench.now) for key in accepted) == len(accepted) + 1
    assert b.count(f"tenant-{4999}", "rpm", 3600.0, bench.now) == 0
    bench.now += 3600.0  # the window expires: its counters leave at the next flush, freeing their slots
    bench.tick()
    assert a.incr("tenant-4999", "rpm", 3600.0, bench.now) == 1


def test_housekeeping_runs_while_counters_cannot_be_published() -> None:
    # a counted 800 keys under a 64 KiB row bound, then restarted with the default 16 KiB: the previous
    # life's counters are adopted whole (dropping them would under-count) and cannot be published.
    roomy = StateConfig(dead_gc_delay_s=2.0, housekeeping_interval_s=0.5, max_doc_bytes=256 * 1024)
    roomy = roomy.with_(counter_shards=1, max_row_bytes=64 * 1024)
    bench = Bench(("a", "b", "c"), roomy)
    for i in range(800):
        bench.nodes["a"].incr(f"tenant-{i}", "rpm", 3600.0, bench.now)
    _janitor_chores(bench)
    before = bench.nodes["a"].doc_sizes()["g/workers"]
    a = bench.nodes["a"] = ClusterState("a", roomy.with_(max_row_bytes=16 * 1024, max_doc_bytes=64 * 1024))
    bench.push_pull("a", "b", join=True)
    for _ in range(16):
        bench.tick()
        bench.gossip(rounds=1)
    bench.anti_entropy()
    _assert_chores_done(bench, before)
    assert a.metrics().counter_flush_failures >= 16
    assert a.count("tenant-7", "rpm", 3600.0, bench.now) == 1  # the adopted counts are still ours, exactly
    assert bench.nodes["b"].count("tenant-7", "rpm", 3600.0, bench.now) == 1


def test_long_keys_are_refused_when_their_shard_is_full_and_the_row_always_fits() -> None:
    config = StateConfig(counter_shards=2, max_row_bytes=4096, max_doc_bytes=16 * 1024)
    state = ClusterState("a", config)
    refused = 0
    for i in range(200):
        try:
            state.incr(f"{i:04d}-" + "k" * 200, "rpm", 60.0, 10.0)
        except StateLimitError as exc:
            assert "max_row_bytes=4096" in str(exc)
            refused += 1
    assert 0 < refused < 200 and state.metrics().counters_refused == refused
    state.incr("0000-" + "k" * 200, "rpm", 60.0, 10.0, 10**30)  # past the reserved digits: accounted at its size
    state.tick(10.0, ["a"])
    assert state.metrics().counter_flush_failures == 0
    assert state.count("0000-" + "k" * 200, "rpm", 60.0, 10.0) == 10**30 + 1
