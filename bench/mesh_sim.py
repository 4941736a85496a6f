"""Simulated measurements of the mesh's SWIM + Lifeguard (the table in mesh/README.md).

    .venv/bin/python -m bench.mesh_sim            # full run, ~2-3 CPU minutes
    .venv/bin/python -m bench.mesh_sim --quick    # fewer seeds and shorter runs, ~30 s

Everything runs in the deterministic simulator (mesh/sim.py): the same seeds print the same figures.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable

from mesh.config import MeshConfig
from mesh.scenarios import (
    FAST,
    bandwidth,
    crash_detection,
    dissemination_rounds,
    false_positives,
    join_convergence,
    percentile,
    refutation,
)

LAN = MeshConfig.lan()


def _timed(label: str, fn: Callable[[], list[str]]) -> list[str]:
    start = time.process_time()
    rows = fn()
    print(f"  [{label}: {time.process_time() - start:.1f} CPU s]", flush=True)
    return rows


def detection(seeds: int) -> list[str]:
    rows = []
    for name, config in (("lan (1 s probes)", LAN), ("200 ms probes", FAST)):
        times = [crash_detection(config, n=5, seed=s) for s in range(seeds)]
        rows.append(
            f"| G1 crash detection, 5 members, {name} | p50 {percentile(times, 50):.2f} s, "
            f"p99 {percentile(times, 99):.2f} s ({seeds} seeds) |"
        )
    return rows


def false_deaths(seeds: int, minutes: float) -> list[str]:
    rows = []
    duration = 60 * minutes
    cases: list[tuple[str, MeshConfig, dict[str, float | str]]] = [
        ("G2 10% loss, lan, TCP fallback on", LAN, {"loss": 0.1}),
        ("G2 10% loss, lan, UDP only (no TCP fallback)", LAN.with_(disable_tcp_pings=True), {"loss": 0.1}),
        ("G3 one member stalls 300 ms of every 1 s, 200 ms probes", FAST, {"stall_s": 0.3}),
        (
            "G3 one member SIGSTOPped 3 s of every 15 s, lan",
            LAN,
            {"stall_s": 3.0, "stall_period_s": 15.0, "stall_mode": "pause"},
        ),
    ]
    for label, config, kwargs in cases:
        cells = []
        for mode, cfg in (("Lifeguard on", config), ("off", config.without_lifeguard())):
            runs = [
                false_positives(cfg, n=5, seed=s, duration_s=duration, **kwargs)  # type: ignore[arg-type]
                for s in range(seeds)
            ]
            deaths = sum(r.false_deaths for r in runs)
            suspicions = sum(r.suspicions for r in runs)
            accusations = sum(r.accusations_by_stalled for r in runs)
            extra = f", {accusations} by the stalled member" if "stall_s" in kwargs and accusations else ""
            cells.append(f"{mode}: {deaths} false deaths, {suspicions} suspicions{extra}")
        rows.append(f"| {label}, 5 members, {seeds} x {minutes:g} min | {'; '.join(cells)} |")
    return rows


def dissemination(seeds: int, big: int) -> list[str]:
    rows = []
    for n, count in ((10, seeds), (big, max(1, seeds // 10))):
        rounds = [dissemination_rounds(LAN, n=n, seed=s) for s in range(count)]
        rows.append(
            f"| G4 dissemination of an update, {n} members (bound log2 n + 3 = {math.log2(n) + 3:.1f}) | "
            f"p50 {percentile(rounds, 50):.2f}, max {max(rounds):.2f} gossip intervals ({count} seeds) |"
        )
    refs = [refutation(LAN, n=5, seed=s) for s in range(seeds)]
    rows.append(
        f"| G5 refutation of a false suspicion, 5 members | suspect hears it in p50 "
        f"{percentile([r.to_refute for r in refs], 50):.2f} / max {max(r.to_refute for r in refs):.2f}; "
        f"refutation everywhere in p50 {percentile([r.to_everyone for r in refs], 50):.2f} / max "
        f"{max(r.to_everyone for r in refs):.2f} gossip intervals ({seeds} seeds) |"
    )
    return rows


def bytes_per_node(minutes: float) -> list[str]:
    rates = {n: bandwidth(LAN, n=n, seed=1, duration_s=60 * minutes) for n in (3, 5, 9)}
    cells = ", ".join(f"{n} members {rate:.0f} B/s" for n, rate in rates.items())
    return [f"| G6 bytes sent per member per second, lan, steady state ({minutes:g} min) | {cells} |"]


def join(big: int) -> list[str]:
    t = join_convergence(LAN, n=big, seed=1)
    return [
        f"| {big} members join through one seed at once | all see all alive after {t:.1f} s "
        f"({t / LAN.gossip_interval_s:.0f} gossip intervals) |"
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer seeds and shorter runs")
    args = parser.parse_args(argv)
    seeds, minutes, big = (6, 2.0, 50) if args.quick else (50, 10.0, 200)
    fp_seeds = 2 if args.quick else 5
    print("| measurement | result |")
    print("|---|---|")
    rows: list[str] = []
    rows += _timed("detection", lambda: detection(seeds))
    rows += _timed("false positives", lambda: false_deaths(fp_seeds, minutes))
    rows += _timed("dissemination", lambda: dissemination(seeds, big))
    rows += _timed("bandwidth", lambda: bytes_per_node(minutes))
    rows += _timed("join", lambda: join(big))
    print()
    print("| measurement | result |")
    print("|---|---|")
    for row in rows:
        print(row)


if __name__ == "__main__":
    main()
