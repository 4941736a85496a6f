"""Simulated measurements of the replicated cluster state (mesh/state/) over the simulated mesh.

    .venv/bin/python -m bench.state_bench            # full run: 10 simulated minutes of churn
    .venv/bin/python -m bench.state_bench --quick    # 2 simulated minutes, fewer writes
    .venv/bin/python -m bench.state_bench --only churn --only micro --churn 1000:16:1.0   # ~30 CPU s

Real SWIM cores (LAN profile: 200 ms gossip to 3 members, 1 s probes, 30 s push-pull) on the simulated
network (0.5-1 ms one-way latency), 5 members, every state a ClusterState delegate; deterministic by
seed. Bytes are UDP/TCP payload bytes sent by the mesh (membership + state), per member per second.
Memory is the resident set of this one process, which holds all 5 members (Rust-side pycrdt memory is
invisible to tracemalloc, so RSS it is), sampled every simulated second.
"""

from __future__ import annotations

import argparse
import random
import resource
import time
from collections.abc import Callable
from pathlib import Path

from mesh.config import MeshConfig
from mesh.scenarios import percentile
from mesh.sim import Link
from mesh.state import ClusterState
from mesh.state.config import StateConfig
from mesh.state.sim import StateSim
from mesh.state.values import Change

LAN = MeshConfig.lan()
N = 5
SETTLE_S = 15.0
#: Churn seconds not sampled for staleness: every row's first version is a burst of new documents.
WARMUP_S = 10
PARTS = ("propagation", "churn", "idle", "micro")
#: The default churn runs: (workers, load-table shards, fraction of the workers changing per second).
CHURNS = ((1000, 16, 1.0), (1000, 16, 0.1), (200, 4, 1.0))


def rss_bytes() -> int:
    """This process's resident set now (Linux /proc), else its peak so far."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return pages * resource.getpagesize()


def _settled(seed: int, *, config: StateConfig | None = None, link: Link | None = None) -> StateSim:
    sim = StateSim(N, seed=seed, state_config=config, link=link)
    sim.run_for(SETTLE_S)
    return sim


def propagation(writes: int, loss: float, seed: int = 1) -> list[float]:
    """Seconds from a row write until every other member has applied it (or a newer version of the
    row, which supersedes it), for ``writes`` writes by random members at random moments."""
    sim = _settled(seed, link=Link(loss=loss))
    rng = random.Random(seed)
    times: list[float] = []
    pending: dict[tuple[str, int], tuple[float, set[str]]] = {}

    def watcher(observer: str) -> Callable[[Change], None]:
        def on_change(change: Change) -> None:
            if change.local or change.table != "health" or not isinstance(change.value, dict):
                return
            seen = change.value["i"]
            assert isinstance(seen, int)
            # Row deltas supersede: a newer version seen also delivers every older one.
            for key in [k for k in pending if k[0] == change.key and k[1] <= seen]:
                entry = pending[key]
                entry[1].discard(observer)
                if not entry[1]:
                    times.append(sim.net.now - entry[0])
                    del pending[key]

        return on_change

    for name in sim.live():
        sim.states[name].subscribe(watcher(name))
    names = sim.live()
    for i in range(writes):
        writer = rng.choice(names)
        pending[(writer, i)] = (sim.net.now, {n for n in names if n != writer})
        sim.states[writer].set_row("health", {"i": i, "ok": True, "load": rng.randrange(100)})
        sim.run_for(rng.uniform(0.2, 1.2))
    sim.run_for(2 * LAN.push_pull_interval_s)
    if pending:
        raise AssertionError(f"{len(pending)} writes never reached everyone")
    return times


def churn(workers: int, seconds: int, shards: int, changed: float, seed: int = 2) -> dict[str, float]:
    """Every member rewrites the load of its share of ``workers`` once a second (a ``changed`` fraction
    of them with new values) plus a small health row, for ``seconds``; returns the figures."""
    config = StateConfig(table_shards=(("load", shards),))
    sim = _settled(seed, config=config)
    rng = random.Random(seed)
    names = sim.live()
    per_node = workers // N
    loads: dict[str, dict[str, list[float | int]]] = {
        name: {f"{name}-w{w}": [0, 0.0] for w in range(per_node)} for name in names
    }
    start_bytes = {n: sim.bytes_out(n) for n in names}
    start = sim.net.now
    rss_start = rss_bytes()
    rss: list[int] = []
    sizes: list[int] = []
    staleness: list[float] = []
    for second in range(seconds):
        for name in names:
            mine = loads[name]
            for worker in rng.sample(sorted(mine), int(per_node * changed)):
                mine[worker] = [rng.randrange(64), round(rng.random(), 3)]
            state = sim.states[name]
            state.set_row("load", mine)  # type: ignore[arg-type]
            state.set_row("health", {"ok": True, "t": second})
        sim.run_for(1.0)
        rss.append(rss_bytes())
        if second < WARMUP_S:
            continue
        for observer in names:  # how old is what each member sees of the others' health rows
            rows = sim.states[observer].rows("health")
            for writer in names:
                if writer != observer:
                    row = rows.get(writer)
                    seen = row.get("t") if row is not None else None
                    staleness.append(float(second - seen) if isinstance(seen, int) else float(seconds))
        if second % 60 == 59 or second == seconds - 1:
            sizes.append(sum(sim.states[names[0]].doc_sizes().values()))
    elapsed = sim.net.now - start
    out_bytes = [(sim.bytes_out(n) - start_bytes[n]) / elapsed for n in names]
    metrics = [sim.states[n].metrics() for n in names]
    return {
        "doc_first_min": sizes[0],
        "doc_last": sizes[-1],
        "doc_max": max(sizes),
        "bytes_per_s": sum(out_bytes) / len(out_bytes),
        "stale_p50": percentile(staleness, 50),
        "stale_p99": percentile(staleness, 99),
        "oversized": sum(m.deltas_oversized for m in metrics),
        "dropped": sum(m.deltas_dropped for m in metrics),
        "deltas_out": sum(m.deltas_out for m in metrics),
        "compactions": sum(m.compactions for m in metrics),
        "rss_start": rss_start,
        "rss_first_min": max(rss[:60]),
        "rss_max": max(rss),
        "rss_end": rss[-1],
    }


def idle_bandwidth(seconds: float, with_state: bool, seed: int = 3) -> float:
    """Bytes per member per second of a quiet 5-member cluster (membership + idle state sync)."""
    sim = StateSim(N, seed=seed)
    if with_state:
        for name in sim.live():
            sim.states[name].set_row("health", {"ok": True, "pad": "x" * 100})
    else:
        for node in sim.sim_nodes.values():  # a mesh without a delegate: the baseline
            node.swim._delegate = None
            node.swim._out._delegate = None
    sim.run_for(SETTLE_S)
    names = sim.live()
    start = {n: sim.bytes_out(n) for n in names}
    sim.run_for(seconds)
    return sum(sim.bytes_out(n) - start[n] for n in names) / len(names) / seconds


def _state_micro() -> list[str]:
    """Single-thread costs of the core operations (no network)."""
    a, b = ClusterState("a"), ClusterState("b")
    rows = 5000
    t0 = time.perf_counter()
    msgs = []
    for i in range(rows):
        a.set_row("health", {"i": i, "ok": True})
        msgs.extend(a.get_broadcasts(5, 1300))
    t1 = time.perf_counter()
    for msg in msgs:
        b.notify_msg(msg)
    t2 = time.perf_counter()
    size = sum(len(m) for m in msgs) / len(msgs)
    return [
        f"| local row write + delta | {rows / (t1 - t0):,.0f}/s, {size:.0f} B per delta |",
        f"| remote delta apply | {len(msgs) / (t2 - t1):,.0f}/s |",
    ]


def _counter_micro(keys: int = 1000, peers: int = 4, ops: int = 50_000) -> list[str]:
    """Single-thread costs of the rate-limit counters: ``incr`` (which returns the global count) and
    ``count`` of one of ``keys`` counters whose shards ``peers`` other nodes also publish, and the
    flush of a full node (``max_counter_fields`` counters) at a tick."""
    now = 1_700_000_000.0
    names = [f"n{i}" for i in range(peers + 1)]
    states = {name: ClusterState(name) for name in names}
    for state in states.values():
        for k in range(keys):
            state.incr(f"tenant-{k}", "rpm", 60.0, now, 3)
        state.tick(now, names)
    for a in states.values():  # every node has every other's shards
        for b in states.values():
            if a is not b:
                b.merge_remote_state(a.local_state(True), True)
    me = states["n0"]
    keys_of = [f"tenant-{i % keys}" for i in range(ops)]
    t0 = time.perf_counter()
    for key in keys_of:
        me.incr(key, "rpm", 60.0, now)
    t1 = time.perf_counter()
    expected = 3 * len(names) + ops // keys
    assert me.count("tenant-0", "rpm", 60.0, now) == expected, "the peers' shards are not all summed"
    t1b = time.perf_counter()
    for key in keys_of:
        me.count(key, "rpm", 60.0, now)
    t2 = time.perf_counter()
    full = ClusterState("full")
    fields = full.config.max_counter_fields
    for k in range(fields):
        full.incr(f"tenant-{k}", "rpm", 60.0, now)
    flushes = 20
    t3 = time.perf_counter()
    for i in range(flushes):
        full.incr(f"tenant-{i}", "rpm", 60.0, now)  # one change: the whole row is encoded again
        full.tick(now, ["full"])
    t4 = time.perf_counter()
    incr_s, count_s = (t1 - t0) / ops, (t2 - t1b) / ops
    return [
        f"| counters: incr (returns the global count), {peers + 1} nodes' shards, {keys} keys | "
        f"{1 / incr_s:,.0f}/s, {incr_s * 1e6:.1f} µs per op |",
        f"| counters: count, same | {1 / count_s:,.0f}/s, {count_s * 1e6:.1f} µs per op |",
        f"| counters: flush of a full node ({fields} counters) at a tick | {(t4 - t3) / flushes * 1e3:.1f} ms |",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", action="append", choices=PARTS, help="run only these parts (repeatable)")
    parser.add_argument(
        "--churn", action="append", metavar="WORKERS:SHARDS:CHANGED", help="churn runs instead of the default three"
    )
    args = parser.parse_args()
    parts = set(args.only or PARTS)
    churns = [_churn_spec(spec) for spec in args.churn] if args.churn else CHURNS
    writes = 100 if args.quick else 300
    seconds = 120 if args.quick else 600
    rows = ["| measurement | result |", "|---|---|"]
    clock = time.process_time()
    rss_base = rss_bytes()
    for loss in (0.0, 0.1) if "propagation" in parts else ():
        times = propagation(writes, loss)
        rows.append(
            f"| row propagation to all 4 others, 5 members, lan, {loss:.0%} loss | p50 {percentile(times, 50):.3f} s, "
            f"p99 {percentile(times, 99):.3f} s, max {max(times):.3f} s ({len(times)} writes) |"
        )
        print(rows[-1], flush=True)
    for workers, shards, changed in churns if "churn" in parts else ():
        r = churn(workers, seconds, shards, changed)
        mib = 1024 * 1024
        rows.append(
            f"| churn: {workers} workers' load ({changed:.0%} change/s, {shards} shards) + health rows, "
            f"{seconds // 60} min | doc {r['doc_first_min'] / 1024:.1f} KB after 1 min, "
            f"{r['doc_last'] / 1024:.1f} KB at end (max {r['doc_max'] / 1024:.1f} KB); "
            f"{r['bytes_per_s'] / 1024:.1f} KB/s per member; health staleness p50 {r['stale_p50']:.0f} s, "
            f"p99 {r['stale_p99']:.0f} s; deltas {r['deltas_out']:.0f} sent, {r['oversized']:.0f} too big, "
            f"{r['dropped']:.0f} dropped; {r['compactions']:.0f} compactions; process RSS (5 members) "
            f"{rss_base / mib:.1f} MiB before any member, {r['rss_start'] / mib:.1f} MiB at the churn's start, "
            f"max {r['rss_first_min'] / mib:.1f} MiB in its first minute, max {r['rss_max'] / mib:.1f} MiB "
            f"overall, {r['rss_end'] / mib:.1f} MiB at end |"
        )
        print(rows[-1], flush=True)
    if "idle" in parts:
        idle_s = 120.0 if args.quick else 600.0
        idle_off = idle_bandwidth(idle_s, with_state=False)
        idle_on = idle_bandwidth(idle_s, with_state=True)
        rows.append(
            f"| idle 5-member cluster, bytes/s per member over {idle_s:.0f} s | no delegate {idle_off:.0f} B/s, "
            f"ClusterState with 5 rows {idle_on:.0f} B/s (push-pull diffs) |"
        )
        print(rows[-1], flush=True)
    if "micro" in parts:
        rows.extend(_state_micro())
        rows.extend(_counter_micro())
    print(f"[{time.process_time() - clock:.1f} CPU s]")
    print("\n".join(rows))


def _churn_spec(spec: str) -> tuple[int, int, float]:
    workers, shards, changed = spec.split(":")
    return int(workers), int(shards), float(changed)


if __name__ == "__main__":
    main()
