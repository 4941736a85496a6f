"""A 3|2 partition of five real nodes, healed again; run as `unshare -rn python -m chaos.partition ...`.

Side A (n1-n3, 10.77.0.1-3) lives in the namespace `unshare -rn` gave us, side B (n4, n5, 10.77.0.4-5) in
a second one, joined by a veth pair (netns.py says why one namespace is not enough). Steps: start and
converge; drop mesh traffic between the sides in both input hooks; wait until each side marks the other
dead; flush the rules (heal); wait until all five list five alive members. Prints one JSON object on
stdout, also when a step fails (``ok`` false, ``error`` set): the test reads it. Node logs go to --workdir.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from chaos.cluster import Cluster, Node, Profile, alive_names, sim_worker, wait_until
from chaos.netns import Holder, Netns, veth

SIDE_A = ("10.77.0.1", "10.77.0.2", "10.77.0.3")
SIDE_B = ("10.77.0.4", "10.77.0.5")
MESH_PORT = 7946
HTTP_PORT = 8000
WORKER_PORT = 50051
VETH = ("chaos-a", "chaos-b")


def _netns_id(pid: int | str) -> str:
    return os.readlink(f"/proc/{pid}/ns/net")


def _link_up(ns: Netns, name: str) -> bool:
    return '"operstate": "UP"' in ns.ip("-j", "link", "show", name).replace('":"', '": "')


def run_partition(workdir: Path, model_dir: Path, profile: Profile, timeout_s: float, result: dict[str, Any]) -> None:
    """Run the steps, recording each measurement in ``result`` as it is made (kept when a later step fails)."""
    result["profile"] = profile.label
    ours = Netns()
    with contextlib.ExitStack() as stack:
        holder = Holder(workdir / "holder.log")
        stack.callback(holder.close)
        theirs = holder.netns
        mine = _netns_id("self")
        wait_until(lambda: _netns_id(holder.netns.pid or 0) != mine, timeout_s=10, what="the second namespace")
        ours.setup_chaos_chain()
        theirs.setup_chaos_chain()
        veth(ours, theirs, names=VETH, our_addrs=SIDE_A, their_addrs=SIDE_B)
        wait_until(lambda: _link_up(ours, VETH[0]) and _link_up(theirs, VETH[1]), timeout_s=10, what="the veth link")

        worker = stack.enter_context(sim_worker(model_dir, workdir / "sim.log", host=SIDE_A[0], port=WORKER_PORT))
        cluster = stack.enter_context(Cluster(workdir=workdir, model_dir=model_dir, worker_url=worker, profile=profile))
        seed = f"{SIDE_A[0]}:{MESH_PORT}"
        for k, addr in enumerate(SIDE_A + SIDE_B, start=1):
            cluster.add(
                Node(
                    name=f"n{k}",
                    mesh_host=addr,
                    mesh_port=MESH_PORT,
                    http_host=addr,
                    http_port=HTTP_PORT,
                    join=() if k == 1 else (seed,),
                    prefix=theirs.prefix if addr in SIDE_B else (),
                    # 10.77.0.x is not loopback: a keyless mesh and an open HTTP API there are refused unless
                    # declared insecure / open. The namespaces are private to this run: nobody else reaches them.
                    extra=("--mesh-insecure", "--auth", "none"),
                )
            )
        nodes = list(cluster.nodes.values())
        side_a, side_b = nodes[: len(SIDE_A)], nodes[len(SIDE_A) :]
        cluster.start(*nodes)
        cluster.wait_up(*nodes)
        result["converged_s"] = round(cluster.wait_converged(nodes, timeout_s=timeout_s), 3)

        # Partition: each side's input hook drops the other side's mesh packets (UDP and TCP).
        cut_at = time.time()
        ours.drop_from(SIDE_B, MESH_PORT)
        theirs.drop_from(SIDE_A, MESH_PORT)
        detected: dict[str, dict[str, float]] = {}
        for observers, others in ((side_a, side_b), (side_b, side_a)):
            for subject in others:
                seen = cluster.wait_state(observers, subject.name, ["dead"], timeout_s)
                for observer, member in seen.items():
                    detected.setdefault(observer, {})[subject.name] = round(member.changed_at - cut_at, 3)
        result["detected_s"] = detected
        result["partition_detected_s"] = max(t for row in detected.values() for t in row.values())
        # Within a side nobody may have been lost: each side lists its own members alive.
        during: dict[str, list[str]] = {}
        for observers in (side_a, side_b):
            for name, view in cluster.views(observers).items():
                during[name] = sorted(alive_names(view or {}))
        result["alive_during_partition"] = during

        heal_at = time.monotonic()
        ours.heal()
        theirs.heal()
        cluster.wait_converged(nodes, timeout_s=timeout_s)
        result["healed_s"] = round(time.monotonic() - heal_at, 3)
        result["final"] = {
            name: {m.name: m.state for m in (view or {}).values()} for name, view in cluster.views(nodes).items()
        }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workdir", required=True, type=Path)
    parser.add_argument("--model-path", required=True, type=Path)
    parser.add_argument("--profile", default="lan", choices=("lan", "wan", "local"))
    parser.add_argument("--probe-interval-s", type=float, default=0.0)
    parser.add_argument("--timeout-s", type=float, default=60.0, help="bound on each wait")
    args = parser.parse_args(argv)
    profile = Profile(args.profile, args.probe_interval_s)
    result: dict[str, Any] = {"ok": False}
    try:
        run_partition(args.workdir, args.model_path, profile, args.timeout_s, result)
        result["ok"] = True
    except Exception as exc:  # reported to the test, which shows it with the node logs
        result["error"] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(result), flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
