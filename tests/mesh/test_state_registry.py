"""Shared registries: last-writer-wins by our HLC, removals that propagate, entries that outlive their
writer, tombstones that expire, and a restarted writer that cannot lose to its previous life."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mesh.state import ClusterState
from mesh.state.config import StateConfig
from mesh.state.hlc import Hlc, HybridClock
from mesh.state.registry import Slot, parse_slot
from mesh.state.values import Change
from tests.mesh.test_state_helpers import Bench

FAST_GC = StateConfig(dead_gc_delay_s=5.0, housekeeping_interval_s=1.0, tombstone_ttl_s=60.0)


def test_concurrent_add_and_remove_converge_on_the_later_hlc_everywhere() -> None:
    for remover_later in (True, False):
        bench = Bench(("a", "b", "c"))
        a, b = bench.nodes["a"], bench.nodes["b"]
        # Concurrent: neither has seen the other's write. pycrdt's client-id order plays no part.
        if remover_later:
            a.add("workers", "w", {"url": "x"}, 100.0)
            b.remove("workers", "w", 100.5)
        else:
            b.remove("workers", "w", 100.0)
            a.add("workers", "w", {"url": "x"}, 100.5)
        bench.gossip(rounds=6)
        bench.assert_converged()
        expected = {} if remover_later else {"w": {"url": "x"}}
        assert all(dict(s.entries("workers")) == expected for s in bench.live)


def test_equal_wall_clocks_tie_break_on_the_writer_name() -> None:
    bench = Bench(("a", "b"))
    bench.nodes["a"].add("t", "k", "from-a", 50.0)
    bench.nodes["b"].add("t", "k", "from-b", 50.0)
    bench.gossip(rounds=4)
    assert all(s.entries("t") == {"k": "from-b"} for s in bench.live)


def test_a_removal_on_one_node_propagates() -> None:
    bench = Bench(("a", "b", "c"))
    bench.nodes["a"].add("workers", "w1", {"url": "grpc://w1"}, bench.now)
    bench.gossip(rounds=5)
    assert all("w1" in s.entries("workers") for s in bench.live)
    bench.now += 1
    bench.nodes["c"].remove("workers", "w1", bench.now)
    bench.gossip(rounds=5)
    assert all("w1" not in s.entries("workers") for s in bench.live)


def test_a_node_with_a_slow_clock_still_removes_what_it_has_seen() -> None:
    bench = Bench(("a", "b"))
    bench.nodes["a"].add("workers", "w", 1, 2_000.0)
    bench.gossip(rounds=3)
    bench.nodes["b"].remove("workers", "w", 1_000.0)  # b's clock is 1000 s behind: the HLC still orders it after
    bench.gossip(rounds=3)
    assert all(s.entries("workers") == {} for s in bench.live)


def test_entries_survive_the_death_of_their_writer() -> None:
    bench = Bench(("a", "b", "c"), FAST_GC)
    bench.tick()
    bench.nodes["c"].add("workers", "w-c", {"url": "grpc://c"}, bench.now)
    bench.gossip(rounds=5)
    bench.down.add("c")
    for _ in range(40):  # 10 s: past dead_gc_delay_s, housekeeping every 1 s
        bench.tick()
        bench.gossip(rounds=1)
    for state in bench.live:
        assert state.entries("workers") == {"w-c": {"url": "grpc://c"}}
        # The janitor (smallest live name: "a") adopted c's slot and deleted c's.
        assert sorted(state.doc_values("g/workers")) == ["w-c\x1fa"]
    bench.now += 1
    bench.nodes["b"].remove("workers", "w-c", bench.now)  # and it can still be removed
    bench.gossip(rounds=4)
    assert all(s.entries("workers") == {} for s in bench.live)


def test_dominated_and_duplicate_slots_are_collected_and_tombstones_expire() -> None:
    bench = Bench(("a", "b", "c"), FAST_GC)
    bench.tick()
    for name in ("a", "b", "c"):
        bench.now += 0.01
        bench.nodes[name].add("t", "k", name, bench.now)
    bench.gossip(rounds=4)
    assert all(len(s.doc_values("g/t")) == 3 for s in bench.live)
    for _ in range(8):
        bench.tick()
        bench.gossip(rounds=1)
    # Only the winner's slot is left (c wrote last), and the value did not change on the way.
    assert all(s.doc_values("g/t").keys() == {"k\x1fc"} and s.entries("t") == {"k": "c"} for s in bench.live)
    bench.nodes["a"].remove("t", "k", bench.now)
    bench.gossip(rounds=4)
    for _ in range(8):
        bench.tick()
        bench.gossip(rounds=1)
    assert all(s.doc_values("g/t").keys() == {"k\x1fa"} for s in bench.live)  # the tombstone
    for _ in range(4 * 65):  # past tombstone_ttl_s
        bench.tick()
    bench.gossip(rounds=4)
    assert all(s.doc_values("g/t") == {} and s.entries("t") == {} for s in bench.live)


def test_a_restarted_writer_does_not_lose_to_its_previous_life() -> None:
    """pycrdt orders concurrent writes to one key by client id; our slot reconciliation puts the
    higher HLC back whichever way pycrdt went."""
    for attempt in range(6):
        bench = Bench(("a", "b"), seed=attempt)
        bench.nodes["a"].add("t", "k", "old-life", 100.0)
        bench.gossip(rounds=3)
        fresh = bench.restart("a")  # it has not synced yet: its write is concurrent with the old one
        fresh.remove("t", "k", 200.0)
        bench.gossip(rounds=3)
        bench.anti_entropy()
        bench.gossip(rounds=3)
        bench.anti_entropy()
        bench.assert_converged()
        assert all(s.entries("t") == {} for s in bench.live), attempt


def test_subscribers_see_entry_changes_with_their_origin() -> None:
    bench = Bench(("a", "b"))
    seen: list[Change] = []
    bench.nodes["b"].subscribe(seen.append)
    bench.nodes["a"].add("workers", "w", {"v": 1}, 10.0)
    bench.gossip(rounds=2)
    bench.nodes["b"].remove("workers", "w", 11.0)
    assert [(c.kind, c.key, c.value, c.previous, c.local) for c in seen] == [
        ("entry", "w", {"v": 1}, None, False),
        ("entry", "w", None, {"v": 1}, True),
    ]


def test_slot_encoding_round_trips_and_rejects_garbage() -> None:
    slot = Slot.make(Hlc(1_700_000_000_000, 3), "node-1", {"big": 2**90}, deleted=False)
    assert parse_slot(slot.text) == slot
    for bad in ("", "[", "{}", "[1,2,3]", '[1,0,"a",2,null]', '[1,0,"a",true,null]', '["1",0,"a",0,1]'):
        assert parse_slot(bad) is None


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1e6), st.booleans()), max_size=30))
def test_hlc_is_strictly_increasing_whatever_the_wall_clock_does(steps: list[tuple[float, bool]]) -> None:
    clock = HybridClock()
    last = clock.last
    for now, observe in steps:
        if observe:
            clock.observe(Hlc(int(now * 1000) + 5, 7))
        stamp = clock.tick(now)
        assert stamp > last
        last = stamp


def test_bad_keys_and_tables_are_refused() -> None:
    state = ClusterState("a")
    for table, key in (("", "k"), ("~x", "k"), ("a/b", "k"), ("t", ""), ("t", "a\x1fb"), ("t", "k" * 300)):
        try:
            state.add(table, key, 1, 0.0)
        except ValueError:
            continue
        raise AssertionError(f"{table!r}/{key!r} accepted")
