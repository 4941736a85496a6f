"""A sans-IO test bench for ClusterState: nodes wired by direct Delegate calls, no sockets.

``Bench`` carries deltas through a faulty "network" (loss, duplication, reordering chosen by a seeded
RNG or by hypothesis) and runs push-pull between pairs exactly as the mesh does: each side's state is
built before the other's is merged.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping

from mesh.state import ClusterState
from mesh.state.config import StateConfig

#: What the mesh's outbox passes: a compound part header (2) + the USER message header (3).
OVERHEAD = 5
#: Room a packet leaves for broadcasts after a ping (about what the outbox computes).
LIMIT = 1300


class Bench:
    def __init__(self, names: Iterable[str], config: StateConfig | None = None, *, seed: int = 0) -> None:
        self.config = config or StateConfig()
        self.nodes: dict[str, ClusterState] = {n: ClusterState(n, self.config) for n in names}
        self.down: set[str] = set()
        self.inflight: list[tuple[str, bytes]] = []
        self.rng = random.Random(seed)
        self.now = 1_000.0

    @property
    def live(self) -> list[ClusterState]:
        return [s for n, s in self.nodes.items() if n not in self.down]

    def alive_names(self) -> list[str]:
        return [n for n in self.nodes if n not in self.down]

    def tick(self, dt: float = 0.25) -> None:
        self.now += dt
        alive = self.alive_names()
        for state in self.live:
            state.tick(self.now, alive)

    def send(self, *, fanout: int = 3, loss: float = 0.0, duplicate: float = 0.0) -> int:
        """One gossip round as the mesh does it: every live node sends ``fanout`` packets, each to one
        random peer and each filled by its own ``get_broadcasts`` call. Loss drops a whole packet."""
        sent = 0
        names = self.alive_names()
        for state in self.live:
            peers = [n for n in names if n != state.node_id]
            if not peers:
                continue
            for dst in self.rng.sample(peers, min(fanout, len(peers))):
                msgs = state.get_broadcasts(OVERHEAD, LIMIT)
                if not msgs or self.rng.random() < loss:
                    continue
                copies = 2 if self.rng.random() < duplicate else 1
                self.inflight.extend((dst, msg) for msg in msgs * copies)
                sent += len(msgs)
        return sent

    def deliver(self, *, reorder: bool = True) -> None:
        batch, self.inflight = self.inflight, []
        if reorder:
            self.rng.shuffle(batch)
        for dst, msg in batch:
            if dst not in self.down:
                self.nodes[dst].notify_msg(msg)

    def gossip(self, rounds: int = 10, *, loss: float = 0.0, duplicate: float = 0.0) -> None:
        for _ in range(rounds):
            self.send(loss=loss, duplicate=duplicate)
            self.deliver()

    def push_pull(self, a: str, b: str, *, join: bool = False) -> None:
        sa, sb = self.nodes[a], self.nodes[b]
        request = sa.local_state(join)
        reply = sb.local_state(join)  # memberlist's order: the reply is built before merging
        sb.merge_remote_state(request, join)
        sa.merge_remote_state(reply, join)

    def anti_entropy(self, rounds: int = 2) -> None:
        names = self.alive_names()
        for _ in range(rounds):
            for a in names:
                for b in names:
                    if a < b:
                        self.push_pull(a, b)

    def restart(self, name: str) -> ClusterState:
        """A new process under the same name: empty state, new pycrdt client ids."""
        self.down.discard(name)
        self.nodes[name] = ClusterState(name, self.config)
        return self.nodes[name]

    def snapshot(self, state: ClusterState) -> dict[str, Mapping[str, str]]:
        return {doc: state.doc_values(doc) for doc in state.doc_names() if state.doc_values(doc)}

    def assert_converged(self) -> None:
        live = self.live
        first = self.snapshot(live[0])
        for state in live[1:]:
            assert self.snapshot(state) == first, f"{state.node_id} differs from {live[0].node_id}"
