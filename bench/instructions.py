"""Instructions per request of one or more smg-node trees, counted by callgrind: a figure that does not move
with the load on the machine (timings on these shared cores cannot separate a 10 % change; this can).

    .venv/bin/python -m bench.instructions                          # this tree, 200/20 streamed, 16 users
    .venv/bin/python -m bench.instructions --trees /path/to/old,.   # before/after (each tree's own code)

One zero-latency sim worker; each tree's node in turn runs under `valgrind --tool=callgrind` with
instrumentation off, answers a warm-up of ``--warmup`` requests, then counts instructions over ``--requests``
requests only (`callgrind_control -i on/off`). Reported: instructions per request (node process, every
thread). Needs valgrind (Debian's package); ~1 min per tree at the defaults (the node runs ~50x slower).

Caveat: the count is repeatable, but it is the node's work in one regime. Slowed down 50x, the node finds most
of a request's worker messages waiting when it reads, so work done per read rather than per message (one
Output step, one SSE write for all the tokens that arrived together) weighs less here than at full speed;
compare trees with it, and confirm a change's size with wall-clock CPU (`bench.gateway_bench`).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from bench import corpora, folders, launch, prompts
from bench.load import ChatLoad, run_point

DEFAULT_OUT_DIR = Path(__file__).resolve().parent / "out" / "instructions"


def _totals(files: list[Path]) -> int:
    total = 0
    for path in files:
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("totals:"):
                total += int(line.split()[1])
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trees", default=".", help="comma-separated checkouts whose node code is counted [.]")
    parser.add_argument("--folder", default="llama3", choices=folders.FOLDERS)
    parser.add_argument("--corpus", default="synthetic", choices=corpora.CORPORA)
    parser.add_argument("--prompt", type=int, default=200)
    parser.add_argument("--output", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR)
    args = parser.parse_args(argv)
    out: Path = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    model_dir = folders.prepare(args.folder, out.parent / "models")
    tokenizer = prompts.load_tokenizer(model_dir)
    overhead = prompts.chat_template_overhead(model_dir, tokenizer)
    pool = corpora.build_pool(args.corpus, tokenizer, overhead, args.prompt, 64)
    worker_port = launch.free_port()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    with launch.running("sim-worker", launch.sim_worker_command(worker_port, model_dir), out / "sim.log") as worker:
        launch.wait_port(worker, worker_port, 60.0)
        for k, tree in enumerate(args.trees.split(",")):
            tree_dir = Path(tree).resolve()
            port = launch.free_port()
            prefix = out / f"callgrind-{stamp}-{k}"
            command = [
                "env", f"PYTHONPATH={tree_dir}",
                "valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={prefix}.out",
                sys.executable, "-m", "node.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
                "--worker", f"grpc://127.0.0.1:{worker_port}", "--model-path", str(model_dir),
                "--log-level", "warning", "--processes", "1",
                # The node runs ~50x slower under valgrind: its health checks must not give up on the worker.
                "--health-timeout-s", "60", "--health-failures-to-unhealthy", "50",
            ]  # fmt: skip
            base_url = f"http://127.0.0.1:{port}"
            # Started in the tree: `python -m` puts the working directory first on sys.path, before PYTHONPATH,
            # so a node started from another checkout would run that checkout's code.
            with launch.running("smg-node", command, out / f"node-{k}.log", cwd=tree_dir) as node:
                model = launch.wait_gateway_ready(node, base_url, pool, 900.0)

                def load(first: int, count: int, url: str = base_url, served: str = model) -> ChatLoad:
                    return ChatLoad(url, served, pool, args.output, args.concurrency, 3600.0, first, count, 600.0)

                run_point(load(1_000, args.warmup))
                subprocess.run(["callgrind_control", "-i", "on", str(node.pid)], check=True, capture_output=True)
                result = run_point(load(1_000_000, args.requests))
                subprocess.run(["callgrind_control", "-i", "off", str(node.pid)], check=True, capture_output=True)
                subprocess.run(["callgrind_control", "-d", str(node.pid)], check=True, capture_output=True)
                time.sleep(2.0)
            done = len(result.samples)
            total = _totals(sorted(out.glob(f"{prefix.name}.out*")))
            per_request = total / max(done, 1)
            print(f"{tree_dir}: {done} requests, {result.error_count} errors, {per_request:,.0f} instructions/request")
    return 0


if __name__ == "__main__":
    sys.exit(main())
