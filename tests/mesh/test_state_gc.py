"""Garbage collection, compaction under generations, bounded size under churn, late joiners, restarts."""

from __future__ import annotations

import random

import pytest

from mesh.state.config import StateConfig
from mesh.state.values import Change
from tests.mesh.test_state_helpers import Bench

FAST = StateConfig(dead_gc_delay_s=3.0, housekeeping_interval_s=0.5, tombstone_ttl_s=30.0)


def _run(bench: Bench, seconds: float, *, gossip: bool = True) -> None:
    for _ in range(int(seconds / 0.25)):
        bench.tick()
        if gossip:
            bench.gossip(rounds=1)


# -- dead rows --


def test_rows_of_dead_nodes_are_removed_after_the_delay_and_only_then() -> None:
    bench = Bench(("a", "b", "c"), FAST)
    bench.tick()
    for state in bench.live:
        state.set_row("health", {"ok": True})
    bench.gossip(rounds=4)
    bench.down.add("c")
    _run(bench, 2.0)
    assert all("c" in s.rows("health") for s in bench.live)  # dead, but not for long enough
    assert all("c" not in s.rows("health", live_only=True) for s in bench.live)
    _run(bench, 2.5)
    assert all(set(s.rows("health")) == {"a", "b"} for s in bench.live)


def test_a_node_wrongly_collected_reasserts_its_row() -> None:
    bench = Bench(("a", "b", "c"), FAST)
    bench.tick()
    bench.nodes["c"].set_row("health", {"ok": True})
    bench.gossip(rounds=4)
    bench.down.add("c")  # a partition: a and b think c died; c keeps running
    _run(bench, 4.0)
    assert "c" not in bench.nodes["a"].rows("health")
    bench.down.discard("c")  # healed: c learns of the deletion and writes its row back
    bench.anti_entropy()
    bench.gossip(rounds=4)
    bench.assert_converged()
    assert all(s.rows("health").get("c") == {"ok": True} for s in bench.live)


# -- compaction and generations --


def _churn_registry(bench: Bench, node: str, n: int) -> None:
    state = bench.nodes[node]
    for i in range(n):
        bench.now += 0.001
        state.add("workers", f"w{i % 40}", {"i": i, "pad": "p" * 40}, bench.now)
        if i % 3 == 0:
            state.remove("workers", f"w{(i * 7) % 40}", bench.now)


def _compacting_config() -> StateConfig:
    return FAST.with_(max_doc_bytes=16 * 1024, max_row_bytes=1024)


def test_a_bloated_document_is_compacted_and_every_node_adopts_the_new_generation() -> None:
    bench = Bench(("a", "b", "c"), _compacting_config())
    bench.tick()
    _churn_registry(bench, "b", 3000)
    bench.gossip(rounds=10)
    bench.anti_entropy()
    before = bench.nodes["a"].doc_sizes()["g/workers"]
    assert before > 16 * 1024
    entries = dict(bench.nodes["a"].entries("workers"))
    bench.now += 1
    bench.nodes["a"].tick(bench.now, ["a", "b", "c"])  # a is the janitor
    gen = bench.nodes["a"].generation("g/workers")
    assert gen is not None and (gen.number, gen.node) == (1, "a")
    assert bench.nodes["a"].doc_sizes()["g/workers"] < before / 2
    # Meanwhile b and c, still on generation 0, keep writing; a does not see it over gossip.
    bench.nodes["b"].add("workers", "late-b", 1, bench.now + 1)
    bench.nodes["c"].remove("workers", "w1", bench.now + 1)
    bench.nodes["c"].set_row("health", {"c": 1})
    bench.gossip(rounds=4)
    assert "late-b" not in bench.nodes["a"].entries("workers")
    bench.anti_entropy()  # push-pull carries generation 1 whole; b and c adopt it and re-add what a lacked
    bench.gossip(rounds=4)
    bench.anti_entropy()
    bench.assert_converged()
    entries["late-b"] = 1
    entries.pop("w1", None)
    for state in bench.live:
        assert dict(state.entries("workers")) == entries
        assert state.rows("health")["c"] == {"c": 1}
        doc_gen = state.generation("g/workers")
        assert doc_gen is not None and doc_gen.number == 1
    assert bench.nodes["b"].metrics().adoptions >= 1


def test_concurrent_compactions_tie_break_on_the_compactor_name() -> None:
    bench = Bench(("a", "b", "c"), _compacting_config())
    bench.tick()
    _churn_registry(bench, "c", 3000)
    bench.gossip(rounds=10)
    bench.anti_entropy()
    bench.now += 1
    bench.nodes["a"].tick(bench.now, ["a", "c"])  # a partition: both a and b believe they are the janitor
    bench.nodes["b"].tick(bench.now, ["b", "c"])
    bench.nodes["a"].add("workers", "from-a", 1, bench.now + 1)
    bench.nodes["b"].add("workers", "from-b", 1, bench.now + 1)
    bench.tick()
    bench.anti_entropy()
    bench.gossip(rounds=4)
    bench.anti_entropy()
    bench.assert_converged()
    for state in bench.live:
        gen = state.generation("g/workers")
        assert gen is not None and (gen.number, gen.node) == (1, "b")
        assert {"from-a", "from-b"} <= set(state.entries("workers"))


def test_live_data_over_the_bound_is_not_compacted_in_a_loop() -> None:
    bench = Bench(("a", "b"), StateConfig(max_doc_bytes=4096, max_row_bytes=1024, housekeeping_interval_s=0.25))
    for i in range(60):
        bench.nodes["a"].add("big", f"k{i}", "x" * 100, bench.now)
    bench.tick()
    bench.tick()
    assert bench.nodes["a"].metrics().compactions == 0


# -- size under churn --


def _churn(n_nodes: int, workers: int, seconds: int, shards: int) -> list[int]:
    """Every node rewrites the load of its share of ``workers`` every second; returns total doc bytes
    (as seen by the first node) after every simulated minute."""
    config = StateConfig(table_shards=(("load", shards),), max_doc_bytes=4 * 1024 * 1024)
    names = [f"gw-{i}" for i in range(n_nodes)]
    bench = Bench(names, config, seed=5)
    rng = random.Random(5)
    sizes = []
    per_node = workers // n_nodes
    for second in range(seconds):
        for i, state in enumerate(bench.live):
            state.set_row(
                "load",
                {f"w{i}-{w}": [rng.randrange(64), round(rng.random(), 3)] for w in range(per_node)},
            )
            state.set_row("health", {"ok": True, "t": second})
        for _ in range(4):
            bench.tick()
            bench.gossip(rounds=1)
        if second % 30 == 29:
            bench.anti_entropy(rounds=1)
        if second % 60 == 59:
            sizes.append(sum(bench.nodes[names[0]].doc_sizes().values()))
    bench.anti_entropy()
    bench.assert_converged()
    return sizes


#: The bound: every writer's last value plus a constant per (writer, document) — about 3 KB per shard
#: value of 200 workers' loads split 16 ways, times 5 writers, plus the health rows: ~60 KB, given 2x room.
CHURN_BOUND_BYTES = 120 * 1024


def test_doc_size_stays_bounded_under_steady_churn() -> None:
    sizes = _churn(n_nodes=5, workers=200, seconds=120, shards=4)
    assert max(sizes) < CHURN_BOUND_BYTES
    assert sizes[-1] <= sizes[0] * 1.1  # flat: overwrites leave nothing behind


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_doc_size_stays_bounded_for_1000_workers_for_10_minutes() -> None:
    sizes = _churn(n_nodes=5, workers=1000, seconds=600, shards=16)
    assert max(sizes) < CHURN_BOUND_BYTES
    assert sizes[-1] <= sizes[0] * 1.1


# -- joiners and restarts --


def test_a_late_joiner_gets_the_whole_state_in_one_push_pull() -> None:
    bench = Bench(("a", "b", "c", "late"))
    bench.down.add("late")
    bench.tick()
    for i, name in enumerate(("a", "b", "c")):
        bench.nodes[name].set_row("health", {"i": i})
        bench.nodes[name].add("workers", f"w{i}", i, bench.now)
        bench.nodes[name].incr("k", "rpm", 1e6, bench.now, i + 1)
    bench.tick()
    bench.gossip(rounds=5)
    bench.down.discard("late")
    bench.push_pull("late", "a", join=True)
    late = bench.nodes["late"]
    assert bench.snapshot(late) == bench.snapshot(bench.nodes["a"])
    assert len(late.rows("health")) == 3 and len(late.entries("workers")) == 3
    assert late.count("k", "rpm", 1e6, bench.now) == 6


def test_a_restarted_node_gets_the_state_and_its_stale_row_is_replaced() -> None:
    bench = Bench(("a", "b", "c"))
    bench.tick()
    for state in bench.live:
        state.set_row("health", {"life": 1})
        state.set_row("cache", {"hot": ["x"]})
    bench.gossip(rounds=5)
    fresh = bench.restart("c")
    fresh.set_row("health", {"life": 2})  # written before it synced: concurrent with its old row
    changes: list[Change] = []
    bench.nodes["a"].subscribe(changes.append)
    bench.push_pull("c", "a", join=True)
    bench.gossip(rounds=5)
    bench.anti_entropy()
    bench.assert_converged()
    for state in bench.live:
        assert state.rows("health")["c"] == {"life": 2}
        assert "c" not in state.rows("cache")  # its previous life's row, not rewritten in this one
    assert any(c.table == "cache" and c.key == "c" and c.value is None for c in changes)
