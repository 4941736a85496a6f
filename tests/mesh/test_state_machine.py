"""A hypothesis state machine over the cluster state: writes, lossy gossip, push-pull, crashes,
restarts, partitions healed late, garbage collection and compaction. After everyone is back and a few
anti-entropy rounds, every node holds the same documents, and what they say matches the operations:
each node's row is the last it wrote in its current life, each registry entry the last write to it."""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from mesh.state.config import StateConfig
from tests.mesh.test_state_helpers import Bench

NAMES = ("a", "b", "c", "d")
CONFIG = StateConfig(
    dead_gc_delay_s=2.0,
    housekeeping_interval_s=0.5,
    max_doc_bytes=4096,
    max_row_bytes=1024,
    table_shards=(("load", 2),),
)


class ClusterMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.bench = Bench(NAMES, CONFIG, seed=0)
        self.bench.tick()
        self.rows: dict[tuple[str, str], dict[str, int] | None] = {}
        self.registry: dict[str, object] = {}
        self.unknown: set[str] = set()

    def _up(self, i: int) -> str | None:
        name = NAMES[i]
        return None if name in self.bench.down else name

    @rule(i=st.integers(0, 3), table=st.sampled_from(["health", "load"]), v=st.integers(0, 9))
    def set_row(self, i: int, table: str, v: int) -> None:
        name = self._up(i)
        if name is not None:
            self.bench.now += 0.002
            row = {"v": v, f"f{v % 3}": v}
            self.bench.nodes[name].set_row(table, row)
            self.rows[(table, name)] = row

    @rule(i=st.integers(0, 3), k=st.integers(0, 5), v=st.integers(0, 99), remove=st.booleans())
    def registry_write(self, i: int, k: int, v: int, remove: bool) -> None:
        name = self._up(i)
        if name is not None:
            self.bench.now += 0.002
            state = self.bench.nodes[name]
            if remove:
                state.remove("workers", f"w{k}", self.bench.now)
                self.registry[f"w{k}"] = None
            else:
                state.add("workers", f"w{k}", {"v": v, "pad": "x" * 60}, self.bench.now)
                self.registry[f"w{k}"] = {"v": v, "pad": "x" * 60}
            self.unknown.discard(f"w{k}")

    @rule(i=st.integers(0, 3))
    def registry_churn(self, i: int) -> None:
        """Enough overwrites to bloat the registry document past max_doc_bytes (compaction bait)."""
        name = self._up(i)
        if name is not None:
            state = self.bench.nodes[name]
            for n in range(400):
                self.bench.now += 0.001
                state.add("workers", f"w{n % 6}", n, self.bench.now)
                self.registry[f"w{n % 6}"] = n
                self.unknown.discard(f"w{n % 6}")

    @rule(i=st.integers(0, 3), n=st.integers(1, 5))
    def incr(self, i: int, n: int) -> None:
        name = self._up(i)
        if name is not None:
            self.bench.nodes[name].incr("k", "rpm", 1e7, self.bench.now, n)

    @rule(loss=st.sampled_from([0.0, 0.3, 1.0]), rounds=st.integers(1, 3))
    def gossip(self, loss: float, rounds: int) -> None:
        self.bench.gossip(rounds=rounds, loss=loss, duplicate=0.2)

    @rule(i=st.integers(0, 3), j=st.integers(0, 3))
    def push_pull(self, i: int, j: int) -> None:
        a, b = self._up(i), self._up(j)
        if a is not None and b is not None and a != b:
            self.bench.push_pull(a, b)

    @rule(seconds=st.sampled_from([0.25, 1.0, 3.0]))
    def time_passes(self, seconds: float) -> None:
        for _ in range(int(seconds / 0.25)):
            self.bench.tick()

    @precondition(lambda self: len(self.bench.down) < 2)
    @rule(i=st.integers(0, 3))
    def crash_or_partition(self, i: int) -> None:
        self.bench.down.add(NAMES[i])

    @rule(i=st.integers(0, 3), restart=st.booleans())
    def come_back(self, i: int, restart: bool) -> None:
        name = NAMES[i]
        if name not in self.bench.down:
            return
        if restart:
            old = self.bench.nodes[name]
            for key in self.registry:
                win = old._registry.winner("workers", key)
                others = [self.bench.nodes[n]._registry.winner("workers", key) for n in NAMES if n != name]
                if win is not None and win.origin == name and all(w != win for w in others):
                    self.unknown.add(key)  # its last write never left the node: lost with it
            self.bench.restart(name)
            for row_key in [k for k in self.rows if k[1] == name]:
                self.rows[row_key] = None  # a new life has written nothing yet
            peer = next(n for n in NAMES if n not in self.bench.down and n != name)
            self.bench.push_pull(name, peer, join=True)
        else:
            self.bench.down.discard(name)

    @invariant()
    def own_rows_are_what_the_owner_last_wrote(self) -> None:
        for (table, owner), row in self.rows.items():
            if owner not in self.bench.down:
                assert self.bench.nodes[owner].rows(table).get(owner) == row

    def teardown(self) -> None:
        bench = self.bench
        bench.down.clear()
        for _ in range(4):
            bench.tick()
            bench.anti_entropy()
            bench.gossip(rounds=3)
        bench.assert_converged()
        for state in bench.live:
            for (table, owner), row in self.rows.items():
                assert state.rows(table).get(owner) == row, (state.node_id, table, owner)
            entries = state.entries("workers")
            for key, value in self.registry.items():
                if key not in self.unknown:
                    assert entries.get(key) == value, (state.node_id, key)
        counts = {s.count("k", "rpm", 1e7, bench.now) for s in bench.live}
        assert len(counts) == 1


ClusterMachine.TestCase.settings = settings(
    max_examples=25, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestClusterMachine = ClusterMachine.TestCase
