"""What an idle meshed node costs: CPU of a node with many registered workers and mesh peers, no requests.

    .venv/bin/python -m bench.mesh_idle                        # 64 workers, 8 peers, 30 s window
    .venv/bin/python -m bench.mesh_idle --workers 64 --peers 8 --seconds 60

One helper process hosts ``--workers`` simulated engines (one `SimWorker` per port, one loaded model shared),
so 64 workers cost one process, not 64. Then ``1 + --peers`` `smg-node serve --processes 1` nodes start,
each registering every worker and joined into one mesh (loopback timing profile, node 0 the seed). After
they settle, each node's CPU over ``--seconds`` is read from /proc: health checks, load polling, SWIM
probes, gossip and state sync are all there is. The target (issue 13): under 1 % of a core per node.

CPU per request with 1, 3 and 8 meshed nodes under one closed-loop load is `bench.mesh_load`.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack, ExitStack
from pathlib import Path

from bench import launch
from bench.proc import sample_tree

DEFAULT_OUT_DIR = Path(__file__).resolve().parent / "out" / "mesh_idle"
# Start-up gossip (joins, a suspicion raised while a peer was still loading) drains well within this.
SETTLE_S = 15.0
TARGET_PCT_OF_CORE = 1.0


async def _serve_workers(model_dir: Path, count: int, ports_file: Path) -> None:
    from node.sim.config import SimWorkerConfig
    from node.sim.worker import SimWorker, load_sim_model

    config = SimWorkerConfig(host="127.0.0.1", port=0, model_path=str(model_dir))
    model = await asyncio.to_thread(load_sim_model, config)
    async with AsyncExitStack() as stack:
        workers = [await stack.enter_async_context(SimWorker(config, model)) for _ in range(count)]
        await asyncio.to_thread(_publish, ports_file, [w.address for w in workers])
        await asyncio.Event().wait()  # until the benchmark stops this process


def _publish(path: Path, addresses: list[str]) -> None:
    # Written whole then renamed: the benchmark polls for the file and must never read half of it.
    partial = path.with_suffix(".partial")
    partial.write_text("\n".join(addresses) + "\n")
    partial.replace(path)


def _start_worker_host(stack: ExitStack, model_dir: Path, count: int, out: Path) -> tuple[launch.Service, list[str]]:
    ports_file = out / "worker-addresses.txt"
    ports_file.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "bench.mesh_idle", "--serve-workers", str(count), "--model-dir", str(model_dir)]
    host = stack.enter_context(launch.running("workers", [*cmd, "--ports-file", str(ports_file)], out / "workers.log"))
    deadline = time.monotonic() + 120.0
    while not ports_file.exists():
        if not host.alive() or time.monotonic() > deadline:
            raise launch.LaunchError(f"the worker host did not start:\n{host.log_tail()}")
        time.sleep(0.2)
    return host, [f"grpc://{address}" for address in ports_file.read_text().split()]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.mesh_idle", description=__doc__)
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--peers", type=int, default=8, help="mesh peers of the measured node")
    parser.add_argument("--seconds", type=float, default=30.0, help="measurement window")
    parser.add_argument(
        "--mesh-profile", choices=("local", "lan", "wan"), default="local", help="the nodes' SWIM profile [local]"
    )
    parser.add_argument(
        "--node-arg",
        action="append",
        default=[],
        help="extra smg-node serve flag, e.g. --node-arg=--health-idle-every=1",
    )
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR)
    parser.add_argument("--serve-workers", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--ports-file", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_workers:
        asyncio.run(_serve_workers(args.model_dir, args.serve_workers, args.ports_file))
        return 0
    launch.exit_on_sigterm()
    out: Path = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    model_dir = launch.prepare_model(out / "models")
    with ExitStack() as stack:
        host, workers = _start_worker_host(stack, model_dir, args.workers, out)
        mesh_ports = [launch.free_port() for _ in range(1 + args.peers)]
        nodes: list[launch.Service] = []
        for i, mesh_port in enumerate(mesh_ports):
            flags = ["--processes", "1", "--mesh-bind", f"127.0.0.1:{mesh_port}", "--mesh-profile", args.mesh_profile]
            flags += args.node_arg
            flags += ["--node-name", f"idle-{i}"] + (["--join", f"127.0.0.1:{mesh_ports[0]}"] if i else [])
            port = launch.free_port()
            cmd = launch.node_command(port, workers, model_dir, flags)
            node = stack.enter_context(launch.running(f"node-{i}", cmd, out / f"node-{i}.log"))
            launch.wait_port(node, port, 120.0)
            nodes.append(node)
        time.sleep(SETTLE_S)
        for node in nodes:
            launch.wait_idle(node, 20.0)
        before = [sample_tree(n.pid).cpu_s for n in [*nodes, host]]
        started = time.monotonic()
        time.sleep(args.seconds)
        elapsed = time.monotonic() - started
        after = [sample_tree(n.pid).cpu_s for n in [*nodes, host]]
        dead = [n.name for n in nodes if not n.alive()]
    pct = [100 * (b - a) / elapsed for a, b in zip(before, after, strict=True)]
    measured, peers, worker_host = pct[0], pct[1:-1], pct[-1]
    verdict = "✅" if measured < TARGET_PCT_OF_CORE else "❌"
    extra = " ".join(args.node_arg) or "no extra flags"
    print(
        f"{args.workers} workers, {args.peers} peers, {args.mesh_profile} profile, {extra}, {elapsed:.0f} s window;"
        f" dead: {dead or 'none'}"
    )
    print(f"measured node: {measured:.2f} % of a core {verdict} (target < {TARGET_PCT_OF_CORE:g} %)")
    if peers:
        print(f"peers: median {statistics.median(peers):.2f} %, max {max(peers):.2f} %")
    print(f"worker host ({args.workers} simulated engines): {worker_host:.2f} %")
    return 0 if measured < TARGET_PCT_OF_CORE and not dead else 1


if __name__ == "__main__":
    sys.exit(main())
