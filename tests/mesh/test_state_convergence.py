"""Convergence: any order, duplication or loss of deltas, then anti-entropy, gives every node the same
state — and the state the operations imply (owners' last rows, the last registry write per key, the
sum of all increments)."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mesh.state.config import StateConfig
from mesh.state.values import Json
from tests.mesh.test_state_helpers import Bench

NAMES = ("n0", "n1", "n2", "n3", "n4")
WINDOW_S = 10_000.0


@dataclass(frozen=True)
class Op:
    node: int
    kind: str
    key: int
    value: int


ops = st.lists(
    st.builds(
        Op,
        node=st.integers(0, 4),
        kind=st.sampled_from(["row", "row", "unrow", "add", "add", "remove", "incr", "deliver", "gossip"]),
        key=st.integers(0, 3),
        value=st.integers(-(2**80), 2**80),
    ),
    max_size=40,
)


def _run(n: int, program: list[Op], loss: float, duplicate: float, shards: int, seed: int) -> None:
    config = StateConfig(table_shards=(("load", shards),))
    bench = Bench(NAMES[:n], config, seed=seed)
    bench.tick()
    rows: dict[tuple[str, str], dict[str, Json] | None] = {}
    registry: dict[str, Json] = {}
    total = 0
    for op in program:
        node = bench.nodes[NAMES[op.node % n]]
        bench.now += 0.002  # every write gets a later HLC than the one before it
        table = ("health", "load")[op.key % 2]
        if op.kind == "row":
            row: dict[str, Json] = {f"f{op.key}": op.value, "w": op.node, "x": [op.value, str(op.value)]}
            node.set_row(table, row)
            rows[(table, node.node_id)] = row
        elif op.kind == "unrow":
            node.delete_row(table)
            rows[(table, node.node_id)] = None
        elif op.kind == "add":
            node.add("workers", f"w{op.key}", {"v": op.value}, bench.now)
            registry[f"w{op.key}"] = {"v": op.value}
        elif op.kind == "remove":
            node.remove("workers", f"w{op.key}", bench.now)
            registry[f"w{op.key}"] = None
        elif op.kind == "incr":
            amount = abs(op.value) % 7
            node.incr(f"k{op.key}", "rpm", WINDOW_S, bench.now, amount)
            total += amount
        elif op.kind == "deliver":
            bench.deliver()
        else:
            bench.tick(0.001)
            bench.send(loss=loss, duplicate=duplicate)
    bench.tick(0.001)  # flush counters
    bench.gossip(rounds=3, loss=loss, duplicate=duplicate)
    bench.anti_entropy()
    bench.assert_converged()
    for state in bench.live:
        for (table, owner), expected in rows.items():
            assert state.rows(table).get(owner) == expected
        entries = state.entries("workers")
        for key, value in registry.items():
            assert entries.get(key) == value
        assert sum(state.count(f"k{k}", "rpm", WINDOW_S, bench.now) for k in range(4)) == total


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(3, 5),
    program=ops,
    loss=st.sampled_from([0.0, 0.2, 0.6, 1.0]),
    duplicate=st.sampled_from([0.0, 0.3]),
    shards=st.sampled_from([1, 3]),
    seed=st.integers(0, 2**16),
)
def test_any_delivery_schedule_converges_after_anti_entropy(
    n: int, program: list[Op], loss: float, duplicate: float, shards: int, seed: int
) -> None:
    _run(n, program, loss, duplicate, shards, seed)


def test_lossless_gossip_alone_converges_without_push_pull() -> None:
    bench = Bench(NAMES[:4], seed=1)
    bench.tick()
    for i, state in enumerate(bench.live):
        state.set_row("health", {"ok": True, "i": i})
        state.add("workers", f"w{i}", {"by": state.node_id}, bench.now)
    bench.gossip(rounds=8)
    bench.assert_converged()
    assert all(len(s.rows("health")) == 4 and len(s.entries("workers")) == 4 for s in bench.live)
    assert all(s.metrics().states_in == 0 for s in bench.live)


def test_reordered_deltas_of_one_writer_are_held_then_applied() -> None:
    bench = Bench(("a", "b"), seed=2)
    a, b = bench.nodes["a"], bench.nodes["b"]
    msgs = []
    for i in range(5):
        a.add("workers", f"w{i}", i, 10.0 + i)  # registry updates travel verbatim, one per operation
        msgs.extend(a.get_broadcasts(5, 1300))
    for msg in reversed(msgs):
        b.notify_msg(msg)
    assert b.entries("workers") == {f"w{i}": i for i in range(5)}
    metrics = b.metrics()
    assert metrics.deltas_held == 4 and metrics.deltas_applied == 5


def test_row_deltas_supersede_instead_of_queueing_history() -> None:
    bench = Bench(("a", "b"), seed=2)
    a, b = bench.nodes["a"], bench.nodes["b"]
    for i in range(200):
        a.set_row("health", {"i": i, "pad": "x" * 100})
    msgs = a.get_broadcasts(5, 1300)
    assert len(msgs) == 1 and len(msgs[0]) < 300  # one delta: the latest value, not 200 of them
    b.notify_msg(msgs[0])
    assert b.rows("health")["a"] == {"i": 199, "pad": "x" * 100}


def test_push_pull_sends_diffs_once_peers_are_known() -> None:
    bench = Bench(("a", "b", "c"), seed=3)
    bench.tick()
    bench.nodes["a"].set_row("health", {"pad": "x" * 500})
    bench.anti_entropy()  # everyone learns everyone's state vectors
    before = bench.nodes["a"].metrics()
    state = bench.nodes["a"].local_state(False)
    after = bench.nodes["a"].metrics()
    assert after.states_out_diff > before.states_out_diff and after.states_out_full == before.states_out_full
    assert len(state) < 300  # the row is not resent: everyone has it
    join_state = bench.nodes["a"].local_state(True)
    assert len(join_state) > 500
