"""The mesh measured with real `smg-node serve` processes (the simulated figures are bench/mesh_sim.py's).

    .venv/bin/python -m bench.mesh_real                      # ~8 min: detection (2 profiles) + bandwidth
    .venv/bin/python -m bench.mesh_real --kills 5 --seconds 30 --sizes 3,5

* Detection (MESH-NOTES G1): 5 nodes on 127.0.0.1-5; kill -9 a non-seed node, time until every survivor
  lists it dead (each survivor's state-change time as it reports it, minus the kill), restart it, wait until
  all five are alive again, repeat. Profiles: lan (1 s probes) and the 200 ms-probe one of the chaos suite.
* Bandwidth (G6): n lan nodes (3, 5, 9) on 127.0.0.11..; after convergence and a warm-up, each node's
  `smg_node_mesh_bytes_out_total` from GET /metrics over a window (UDP and TCP payload bytes, push-pull
  included; the window should span a couple of lan push-pull intervals of 30 s).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from chaos.cluster import (
    FAST_PROFILE,
    LAN_PROFILE,
    Cluster,
    Profile,
    free_port,
    loopback_nodes,
    sim_worker,
)
from chaos.measure import CONVERGE_TIMEOUT_S, kill_and_restart
from mesh.scenarios import percentile
from node.models.prepare import prepare_model

DETECTION_NODES = 5
#: After convergence, let start-up gossip (joins, refutations of suspicions raised while nodes loaded) drain.
BANDWIDTH_WARMUP_S = 10.0
BANDWIDTH_FIRST_HOST = 11
COUNTED = ("bytes_out", "packets_out", "push_pulls")


def _stats(values: list[float]) -> dict[str, float]:
    return {
        "p50": round(percentile(values, 50), 3),
        "p99": round(percentile(values, 99), 3),
        "max": round(max(values), 3),
        "n": len(values),
    }


def detection(profile: Profile, kills: int, model_dir: Path, workdir: Path) -> dict[str, Any]:
    """Kill -9 and restart non-seed nodes ``kills`` times; detection times per kill and per survivor."""
    port = free_port([f"127.0.0.{k}" for k in range(1, DETECTION_NODES + 1)])
    with (
        sim_worker(model_dir, workdir / "sim.log") as worker,
        Cluster(workdir=workdir, model_dir=model_dir, worker_url=worker, profile=profile) as cluster,
    ):
        for node in loopback_nodes(DETECTION_NODES, mesh_port=port):
            cluster.add(node)
        nodes = list(cluster.nodes.values())
        cluster.start(*nodes)
        cluster.wait_up(*nodes)
        cluster.wait_converged(nodes, timeout_s=CONVERGE_TIMEOUT_S)
        pause = 2 * profile.config().probe_interval_s
        found = kill_and_restart(cluster, kills, report=lambda line: print(f"  {line}", flush=True), pause_s=pause)
    return {
        "profile": profile.label,
        "nodes": DETECTION_NODES,
        "every_survivor_s": _stats(found.every_survivor_s),
        "each_survivor_s": _stats(found.each_survivor_s),
        "restart_to_alive_everywhere_s": _stats(found.rejoin_s),
        "raw_every_survivor_s": [round(t, 3) for t in found.every_survivor_s],
    }


def bandwidth(size: int, seconds: float, model_dir: Path, worker_url: str, workdir: Path) -> dict[str, Any]:
    """``size`` lan nodes; mesh bytes each sends per second over ``seconds`` of steady state."""
    hosts = [f"127.0.0.{BANDWIDTH_FIRST_HOST + k}" for k in range(size)]
    port = free_port(hosts)
    with Cluster(workdir=workdir, model_dir=model_dir, worker_url=worker_url, profile=LAN_PROFILE) as cluster:
        for node in loopback_nodes(size, mesh_port=port, first_host=BANDWIDTH_FIRST_HOST):
            cluster.add(node)
        nodes = list(cluster.nodes.values())
        cluster.start(*nodes)
        cluster.wait_up(*nodes)
        cluster.wait_converged(nodes, timeout_s=CONVERGE_TIMEOUT_S)
        time.sleep(BANDWIDTH_WARMUP_S)
        before = {key: cluster.counters(nodes, key) for key in COUNTED}
        time.sleep(seconds)
        after = {key: cluster.counters(nodes, key) for key in COUNTED}
        if not cluster.converged(nodes, cluster.nodes):
            raise RuntimeError(f"the {size}-node cluster lost convergence while measured: {cluster.describe(nodes)}")
    rate = {key: [(after[key][n] - before[key][n]) / seconds for n in after[key]] for key in COUNTED}
    out = rate["bytes_out"]
    return {
        "nodes": size,
        "seconds": seconds,
        "bytes_out_per_s_per_node": {
            "mean": round(sum(out) / size, 1),
            "min": round(min(out), 1),
            "max": round(max(out), 1),
        },
        "packets_out_per_s_per_node": round(sum(rate["packets_out"]) / size, 2),
        "push_pulls_per_min_per_node": round(60 * sum(rate["push_pulls"]) / size, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=10, help="kills per detection profile (>= 5)")
    parser.add_argument("--seconds", type=float, default=60.0, help="bandwidth window (lan push-pull: 30 s)")
    parser.add_argument("--sizes", default="3,5,9", help="cluster sizes for bandwidth")
    parser.add_argument("--skip-detection", action="store_true")
    parser.add_argument("--skip-bandwidth", action="store_true")
    parser.add_argument("--out", type=Path, help="also write the JSON results here")
    args = parser.parse_args(argv)

    results: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    with tempfile.TemporaryDirectory(prefix="mesh_real-") as tmp:
        root = Path(tmp)
        model_dir = prepare_model("llama3", root / "models")
        if not args.skip_detection:
            results["detection"] = []
            for profile in (LAN_PROFILE, FAST_PROFILE):
                workdir = root / f"detect-{profile.name}-{profile.probe_interval_s}"
                workdir.mkdir()
                results["detection"].append(detection(profile, args.kills, model_dir, workdir))
        if not args.skip_bandwidth:
            results["bandwidth"] = []
            with sim_worker(model_dir, root / "bandwidth-sim.log") as worker:
                for size in (int(s) for s in args.sizes.split(",")):
                    workdir = root / f"bandwidth-{size}"
                    workdir.mkdir()
                    row = bandwidth(size, args.seconds, model_dir, worker, workdir)
                    print(f"  bandwidth, {size} nodes: {row}", flush=True)
                    results["bandwidth"].append(row)
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
