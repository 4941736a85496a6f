"""The cluster state carried by the mesh: over the simulated network (real SWIM cores, virtual time) and
over three real `Mesh` instances on 127.0.0.1 sockets."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from contextlib import AsyncExitStack

from mesh import Mesh, MeshConfig
from mesh.sim import Link
from mesh.state import ClusterState
from mesh.state.config import StateConfig
from mesh.state.runner import run_state
from mesh.state.sim import StateSim
from mesh.state.values import Change

LAN = MeshConfig.lan()


def _settled(n: int, seed: int, **kwargs: object) -> StateSim:
    sim = StateSim(n, seed=seed, **kwargs)  # type: ignore[arg-type]
    sim.run_for(15.0)
    return sim


def _propagation_s(sim: StateSim, writer: str, write: Callable[[ClusterState], None], key: str) -> float:
    """Seconds until every other live member has seen ``write``'s change to ``key``."""
    seen: dict[str, float] = {}
    unsubscribes = []
    for name in sim.live():
        if name != writer:

            def record(change: Change, name: str = name) -> None:
                if change.key == key and not change.local:
                    seen.setdefault(name, sim.net.now)

            unsubscribes.append(sim.states[name].subscribe(record))
    start = sim.net.now
    write(sim.states[writer])
    others = len(sim.live()) - 1
    while len(seen) < others and sim.net.now - start < 60:
        sim.run_for(0.01)
    for unsubscribe in unsubscribes:
        unsubscribe()
    assert len(seen) == others, f"only {sorted(seen)} saw it"
    return max(seen.values()) - start


def test_a_row_change_reaches_every_member_within_a_few_gossip_rounds() -> None:
    sim = _settled(5, seed=1)
    for i in range(10):
        elapsed = _propagation_s(sim, "s2", lambda s, i=i: s.set_row("health", {"i": i}), "s2")  # type: ignore[misc]
        # G4's bound for dissemination (log2 n + 3 gossip intervals = 1.06 s), with room for a tick.
        assert elapsed < 1.1, elapsed
        sim.run_for(0.5)
    for state in sim.states.values():
        assert state.rows("health")["s2"] == {"i": 9}


def test_registry_and_counters_travel_and_a_late_joiner_gets_everything_at_join() -> None:
    sim = _settled(3, seed=2)
    sim.states["s1"].add("workers", "w1", {"url": "grpc://w1"}, sim.wall)
    sim.states["s2"].incr("tenant", "rpm", 60.0, sim.wall, 7)
    sim.states["s0"].set_row("cache", {"summary": list(range(50))})
    sim.run_for(2.0)
    assert all(s.entries("workers") == {"w1": {"url": "grpc://w1"}} for s in sim.states.values())
    assert all(s.count("tenant", "rpm", 60.0, sim.wall) == 7 for s in sim.states.values())
    sim.add("late")
    sim.run_for(0.1)  # the join push-pull alone
    late = sim.states["late"]
    assert late.entries("workers") == {"w1": {"url": "grpc://w1"}}
    assert late.rows("cache")["s0"] == {"summary": list(range(50))}
    assert late.count("tenant", "rpm", 60.0, sim.wall) == 7


def test_rows_never_vanish_while_others_relay_newer_values() -> None:
    """Regression: a relayed delta once carried the relay's whole delete set, which deleted other
    writers' older values before their newer ones arrived."""
    sim = _settled(5, seed=5, state_config=StateConfig(table_shards=(("load", 4),)))
    vanished: list[Change] = []
    for state in sim.states.values():
        state.subscribe(lambda c: vanished.append(c) if c.value is None else None)
    for second in range(20):
        for name in sim.live():
            sim.states[name].set_row("load", {f"{name}-w{w}": [second, w] for w in range(40)})
            sim.states[name].set_row("health", {"t": second})
        sim.run_for(1.0)
    assert vanished == []
    assert all(s.rows("health")[n] == {"t": 19} for s in sim.states.values() for n in sim.live())


def test_lossy_links_still_converge() -> None:
    sim = _settled(5, seed=3, link=Link(loss=0.2, jitter_s=0.005, duplicate=0.05))
    for i, name in enumerate(sim.live()):
        sim.states[name].set_row("health", {"i": i})
        sim.states[name].add("workers", f"w{i}", i, sim.wall)
    sim.run_for(5.0)
    for state in sim.states.values():
        assert len(state.rows("health")) == 5 and len(state.entries("workers")) == 5


def test_a_crashed_members_rows_are_collected_and_its_entries_survive() -> None:
    config = StateConfig(dead_gc_delay_s=5.0, housekeeping_interval_s=1.0)
    sim = _settled(4, seed=4, state_config=config)
    sim.states["s3"].set_row("health", {"ok": True})
    sim.states["s3"].add("workers", "w3", {"url": "grpc://w3"}, sim.wall)
    sim.run_for(2.0)
    sim.crash("s3")
    sim.run_for(30.0)  # detection (~6 s) + gc delay + housekeeping
    for name in ("s0", "s1", "s2"):
        state = sim.states[name]
        assert "s3" not in state.rows("health")
        assert state.entries("workers") == {"w3": {"url": "grpc://w3"}}


# -- real sockets --

REAL = MeshConfig.local(
    bind_addr="127.0.0.1",
    bind_port=0,
    probe_interval_s=0.2,
    probe_timeout_s=0.1,
    gossip_interval_s=0.05,
    retransmit_mult=4,
    push_pull_interval_s=5.0,
    join_timeout_s=5.0,
    join_backoff_initial_s=0.1,
)


async def _eventually(predicate: Callable[[], bool], timeout_s: float = 10.0) -> float:
    loop = asyncio.get_running_loop()
    start = loop.time()
    while not predicate():
        if loop.time() - start > timeout_s:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)
    return loop.time() - start


async def test_three_real_meshes_share_state() -> None:
    loop = asyncio.get_running_loop()
    clock = itertools.count(1_700_000_000_000)  # strictly increasing wall ms, independent of the box

    def wall() -> float:
        return next(clock) / 1000.0

    states = [ClusterState(f"m{i}", StateConfig(tick_interval_s=0.1)) for i in range(3)]
    async with AsyncExitStack() as stack:
        meshes = [await stack.enter_async_context(Mesh(REAL.with_(node_name=s.node_id), delegate=s)) for s in states]
        tasks = [loop.create_task(run_state(s, m, clock=wall)) for s, m in zip(states, meshes, strict=True)]
        try:
            states[0].set_row("health", {"seed": True})
            await meshes[1].join([meshes[0].addr])
            await meshes[2].join([meshes[0].addr])
            assert states[2].rows("health")["m0"] == {"seed": True}  # the join push-pull carried it
            states[2].add("workers", "w", {"url": "grpc://w"}, wall())
            states[1].set_row("health", {"load": 5})
            elapsed = await _eventually(
                lambda: (
                    all(s.entries("workers") == {"w": {"url": "grpc://w"}} for s in states)
                    and all(s.rows("health").get("m1") == {"load": 5} for s in states)
                )
            )
            assert elapsed < 2.0  # a few 50 ms gossip rounds, with room for a busy box
            states[0].incr("k", "rpm", 60.0, wall(), 3)
            await _eventually(lambda: all(s.count("k", "rpm", 60.0, wall()) == 3 for s in states))
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
