"""Gateway CPU per request with 1, 3 and 8 meshed nodes under one closed-loop load (issue 13).

    .venv/bin/python -m bench.mesh_load                        # N = 1, 3, 8; 3 repetitions of 20 s each
    .venv/bin/python -m bench.mesh_load --nodes 1,3 --reps 1 --duration-s 3     # a quick look

``--workers`` simulated engines (`smg-node sim-worker`, zero latency, one process each) serve every node. For
each N, N `smg-node serve --processes 1` nodes form one mesh (loopback profile, node 0 the seed; the same
flags as `bench.mesh_idle`), each registering every worker. The load is `bench.load`'s closed loop, the same
for every N: ``--concurrency`` users in all, spread evenly over the nodes (user i to node i mod N), streaming
chat completions of ``--prompt-tokens`` in and ``--output-tokens`` out, every prompt distinct. Per repetition,
over the measured window: requests completed per second, and the CPU of every node process from /proc summed
and divided by the requests (gateway CPU ms/req: request work plus what the mesh, health checks and hints
cost on N nodes); the workers' and the load generator's CPU beside it (on a 2-core machine the load generator
can be the bottleneck of req/s: read req/s with it). The nodes of one N serve all its repetitions; each
repetition starts with ``--warmup-s`` unmeasured. Medians over ``--reps``.

``--variants meshed,alone`` (the default) runs each N twice: meshed, and as N independent nodes (no mesh
flags) under the same split of users. Spreading 16 users over N nodes leaves each node fewer requests in
flight, so less of its per-read and per-write work is shared between requests, mesh or not; the ratio
meshed/alone at the same N is what the mesh itself costs (gossip, CRDT state, hints).

Unlike `bench.affinity_bench --variants mesh` (an open-loop multi-turn workload at a fixed 20 req/s, where the
mesh also shares routing hints), this is a saturating closed loop: CPU per request at the throughput the
machine gives.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from bench import launch, prompts
from bench.load import ChatLoad, LoadResult, run_points
from bench.proc import own_cpu_s, sample_tree

DEFAULT_OUT_DIR = Path(__file__).resolve().parent / "out" / "mesh_load"
#: Joins and the first push-pulls settle within this after the last node opened its port (loopback profile).
SETTLE_S = 5.0
#: Request numbers of node k's users start at k times this: every prompt of a run distinct.
NUMBERS_PER_NODE = 10_000_000
POOL_SIZE = 64


@dataclass(frozen=True, slots=True)
class Rep:
    nodes: int
    variant: str  # "meshed" or "alone"
    requests: int
    errors: int
    wall_s: float
    gateway_cpu_s: float
    worker_cpu_s: float
    loadgen_cpu_s: float

    @property
    def req_s(self) -> float:
        return self.requests / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def gateway_ms_per_req(self) -> float:
        return 1000 * self.gateway_cpu_s / self.requests if self.requests else float("nan")


def _log(message: str) -> None:
    print(f"[mesh_load {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _start_nodes(
    stack: ExitStack,
    count: int,
    workers: list[str],
    model_dir: Path,
    out: Path,
    pool: prompts.PromptPool,
    settle_s: float,
    meshed: bool,
) -> tuple[list[launch.Service], list[str], str]:
    """``count`` nodes, meshed or not, each ready (one request served); their services, base URLs and the
    model id."""
    mesh_ports = [launch.free_port() for _ in range(count)]
    nodes: list[launch.Service] = []
    urls: list[str] = []
    tag = f"{count}-{'meshed' if meshed else 'alone'}"
    for i, mesh_port in enumerate(mesh_ports):
        flags = ["--processes", "1", "--node-name", f"load-{tag}-{i}"]
        if meshed:
            flags += ["--mesh-bind", f"127.0.0.1:{mesh_port}", "--mesh-profile", "local"]
            flags += ["--join", f"127.0.0.1:{mesh_ports[0]}"] if i else []
        port = launch.free_port()
        cmd = launch.node_command(port, workers, model_dir, flags)
        node = stack.enter_context(launch.running(f"node-{tag}-{i}", cmd, out / f"node-{tag}-{i}.log"))
        launch.wait_port(node, port, 120.0)
        nodes.append(node)
        urls.append(f"http://127.0.0.1:{port}")
    model = ""
    for node, url in zip(nodes, urls, strict=True):
        model = launch.wait_gateway_ready(node, url, pool, 120.0)
    time.sleep(settle_s)
    for node in nodes:
        launch.wait_idle(node, 20.0)
    return nodes, urls, model


def _loads(
    urls: list[str], model: str, pool: prompts.PromptPool, args: argparse.Namespace, first: int
) -> list[ChatLoad]:
    """The closed loop's users spread over the nodes: node k gets every N-th user."""
    n = len(urls)
    return [
        ChatLoad(
            base_url=url,
            model=model,
            pool=pool,
            max_tokens=args.output_tokens,
            concurrency=len(range(k, args.concurrency, n)),
            duration_s=args.duration_s,
            first_number=first + k * NUMBERS_PER_NODE,
        )
        for k, url in enumerate(urls)
        if k < args.concurrency
    ]


def _measure(
    nodes: list[launch.Service], workers: list[launch.Service], loads: list[ChatLoad]
) -> tuple[list[LoadResult], float, float, float]:
    """(results, gateway CPU s, worker CPU s, load generator CPU s) over one run of ``loads``."""
    gw0 = sum(sample_tree(n.pid).cpu_s for n in nodes)
    wk0 = sum(sample_tree(w.pid).cpu_s for w in workers)
    lg0 = own_cpu_s()
    results = run_points(loads)
    lg = own_cpu_s() - lg0
    gw = sum(sample_tree(n.pid).cpu_s for n in nodes) - gw0
    wk = sum(sample_tree(w.pid).cpu_s for w in workers) - wk0
    return results, gw, wk, lg


def run_nodes(
    count: int,
    meshed: bool,
    workers: list[launch.Service],
    worker_urls: list[str],
    model_dir: Path,
    pool: prompts.PromptPool,
    args: argparse.Namespace,
) -> list[Rep]:
    out: Path = args.out_dir
    reps: list[Rep] = []
    variant = "meshed" if meshed else "alone"
    with ExitStack() as stack:
        _log(f"{count} node(s), {variant}: starting")
        nodes, urls, model = _start_nodes(stack, count, worker_urls, model_dir, out, pool, args.settle_s, meshed)
        first = 1_000
        for rep in range(args.reps):
            if args.warmup_s > 0:
                warm = [replace(load, duration_s=args.warmup_s) for load in _loads(urls, model, pool, args, first)]
                first = max(r.next_number for r in run_points(warm)) + 1
            results, gw, wk, lg = _measure(nodes, workers, _loads(urls, model, pool, args, first))
            first = max(r.next_number for r in results) + 1
            done = Rep(
                nodes=count,
                variant=variant,
                requests=sum(len(r.samples) for r in results),
                errors=sum(r.error_count for r in results),
                wall_s=max(r.wall_s for r in results),
                gateway_cpu_s=gw,
                worker_cpu_s=wk,
                loadgen_cpu_s=lg,
            )
            dead = [n.name for n in nodes if not n.alive()]
            if dead:
                raise launch.LaunchError(f"nodes died during the run: {', '.join(dead)}")
            errors = next((e for r in results for e in r.errors), "")
            _log(
                f"{count} node(s), {variant}, rep {rep + 1}: {done.req_s:.1f} req/s,"
                f" gateway {done.gateway_ms_per_req:.2f} ms/req, {done.errors} errors {errors}"
            )
            reps.append(done)
    return reps


def render(reps: Sequence[Rep], args: argparse.Namespace) -> str:
    lines = [
        f"{args.workers} sim workers (zero latency); closed loop of {args.concurrency} users spread over the nodes;"
        f" {args.prompt_tokens}-token prompts, {args.output_tokens} output tokens; {args.duration_s:g} s per"
        f" repetition, medians of {args.reps}",
        "",
        "| nodes | variant | req/s | gateway CPU ms/req | vs 1 node | meshed / alone | gateway CPU % of a core |"
        " worker CPU ms/req | loadgen CPU % | errors |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple[int, str], list[Rep]] = {}
    for r in sorted(reps, key=lambda r: (r.nodes, r.variant != "meshed")):
        groups.setdefault((r.nodes, r.variant), []).append(r)
    medians = {key: statistics.median(r.gateway_ms_per_req for r in mine) for key, mine in groups.items()}
    # One node is one node, meshed or not: every row compares with it.
    base = medians.get((1, "meshed")) or medians.get((1, "alone"))
    for (count, variant), mine in groups.items():
        ms = medians[count, variant]
        vs = f"{ms / base:.2f}×" if base else "—"
        alone = medians.get((count, "alone"))
        ratio = f"{ms / alone:.2f}×" if variant == "meshed" and alone else "—"
        req_s = statistics.median(r.req_s for r in mine)
        gw_pct = statistics.median(100 * r.gateway_cpu_s / r.wall_s for r in mine)
        wk = statistics.median(1000 * r.worker_cpu_s / r.requests for r in mine if r.requests)
        lg = statistics.median(100 * r.loadgen_cpu_s / r.wall_s for r in mine)
        errors = sum(r.errors for r in mine)
        lines.append(
            f"| {count} | {variant} | {req_s:.1f} | {ms:.2f} | {vs} | {ratio} | {gw_pct:.0f} | {wk:.2f} | {lg:.0f}"
            f" | {errors} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.mesh_load", description=__doc__)
    parser.add_argument("--nodes", default="1,3,8", help="comma-separated mesh sizes")
    parser.add_argument(
        "--variants", default="meshed,alone", help="meshed, alone (N independent nodes), or both, comma-separated"
    )
    parser.add_argument("--workers", type=int, default=4, help="simulated engines, each serving every node")
    parser.add_argument("--concurrency", type=int, default=16, help="closed-loop users in all")
    parser.add_argument("--prompt-tokens", type=int, default=200)
    parser.add_argument("--output-tokens", type=int, default=20)
    parser.add_argument("--duration-s", type=float, default=20.0, help="measured seconds per repetition")
    parser.add_argument("--warmup-s", type=float, default=3.0, help="unmeasured load before each repetition")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--settle-s", type=float, default=SETTLE_S, help="wait after the mesh formed")
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR)
    args = parser.parse_args(argv)
    counts = [int(x) for x in args.nodes.split(",")]
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if not variants or set(variants) - {"meshed", "alone"}:
        parser.error("--variants takes meshed and/or alone")
    launch.exit_on_sigterm()
    out: Path = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    model_dir = launch.prepare_model(out / "models")
    tokenizer = prompts.load_tokenizer(model_dir)
    overhead = prompts.chat_template_overhead(model_dir, tokenizer)
    pool = prompts.build_pool(tokenizer, overhead, args.prompt_tokens, POOL_SIZE)
    reps: list[Rep] = []
    with ExitStack() as stack:
        ports = [launch.free_port() for _ in range(args.workers)]
        workers = [
            stack.enter_context(
                launch.running(f"sim-{i}", launch.sim_worker_command(port, model_dir), out / f"sim-{i}.log")
            )
            for i, port in enumerate(ports)
        ]
        for worker, port in zip(workers, ports, strict=True):
            launch.wait_port(worker, port, 120.0)
        urls = [f"grpc://127.0.0.1:{port}" for port in ports]
        for count in counts:
            for variant in variants:
                if variant == "alone" and count == 1 and "meshed" in variants:
                    continue  # one node: meshed or not, there is no peer (its meshed run stands for both)
                reps += run_nodes(count, variant == "meshed", workers, urls, model_dir, pool, args)
    table = render(reps, args)
    command = launch.command_line("bench.mesh_load", argv)
    (out / "mesh_load-latest.json").write_text(
        json.dumps({"command": command, "reps": [asdict(r) for r in reps]}, indent=1) + "\n"
    )
    (out / "mesh_load-latest.md").write_text(f"    {command}\n\n{table}\n")
    print(table)
    return 0 if all(r.requests > 0 for r in reps) else 1


if __name__ == "__main__":
    sys.exit(main())
