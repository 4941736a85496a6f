"""Where one gateway's CPU goes at one load point: py-spy on a real node under `bench.load`.

    .venv/bin/python -m bench.gateway_profile --folder llama3-nobos --corpus prose --prompt 7800 --output 20 \\
        --concurrency 1 --duration-s 20

Starts a zero-latency `sim-worker` and one `smg-node serve --processes 1` on the chosen folder, warms the node
up, then runs the closed loop while ``py-spy record`` samples the node (``--native`` adds C frames, ``--idle``
adds waiting threads). Writes the raw samples (collapsed stacks) and prints the node's CPU per request and a
self-time / inclusive-time summary of the stacks; the simulated worker's CPU per request is printed too, and
``--target sim`` samples the worker instead of the node. py-spy is not a dependency: pass its path with ``--py-spy``
(``pip install py-spy`` in any environment; it needs ptrace rights, i.e. root or CAP_SYS_PTRACE).
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from bench import corpora, folders, launch, prompts
from bench.corpora import CORPORA
from bench.folders import FOLDERS
from bench.load import ChatLoad, run_point
from bench.proc import sample_tree, thread_cpu_s

DEFAULT_OUT_DIR = Path(__file__).resolve().parent / "out" / "profile"
POOL_SIZE = 64
PY_SPY_RATE_HZ = 250
# py-spy attaches in well under this; samples taken before the loop starts only add idle frames.
ATTACH_WAIT_S = 1.5


def summarize(collapsed: Path, top: int = 40) -> str:
    """Self and inclusive sample shares per frame from py-spy's collapsed-stack output."""
    self_counts: collections.Counter[str] = collections.Counter()
    incl_counts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.read_text("utf-8", errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        total += count
        self_counts[frames[-1]] += count
        for frame in set(frames):
            incl_counts[frame] += count
    if not total:
        return "no samples"
    lines = [f"{total} samples", "", "self %  frame"]
    lines += [f"{100 * n / total:5.1f}  {frame}" for frame, n in self_counts.most_common(top)]
    lines += ["", "incl %  frame"]
    lines += [f"{100 * n / total:5.1f}  {frame}" for frame, n in incl_counts.most_common(top)]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gateway_profile", description=__doc__)
    parser.add_argument("--folder", choices=FOLDERS, default="llama3-nobos")
    parser.add_argument("--corpus", choices=CORPORA, default="prose")
    parser.add_argument("--prompt", type=int, default=7800, help="prompt tokens")
    parser.add_argument("--output", type=int, default=20, help="output tokens")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--duration-s", type=float, default=20.0)
    parser.add_argument("--py-spy", default="py-spy", help="py-spy executable; 'none' measures CPU only")
    parser.add_argument("--native", action="store_true", help="sample native (C/Rust) frames too")
    parser.add_argument(
        "--gil",
        action="store_true",
        help="sample only the thread holding the GIL (py-spy's idle detection misses"
        " threads parked in a C wait, so without it waiting pool threads count as busy)",
    )
    parser.add_argument("--perf", action="store_true", help="also `perf record` the target (native frames, kernel)")
    parser.add_argument(
        "--target",
        choices=("node", "sim"),
        default="node",
        help="the process py-spy and perf sample: the gateway or the simulated worker",
    )
    parser.add_argument("--node-arg", action="append", default=[], help="extra smg-node serve flag (repeatable)")
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR)
    args = parser.parse_args(argv)
    launch.exit_on_sigterm()
    out: Path = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    model_dir = folders.prepare(args.folder, out.parent / "models")
    tokenizer = prompts.load_tokenizer(model_dir)
    overhead = prompts.chat_template_overhead(model_dir, tokenizer)
    pool = corpora.build_pool(args.corpus, tokenizer, overhead, args.prompt, POOL_SIZE)
    worker_port, port = launch.free_port(), launch.free_port()
    base_url = f"http://127.0.0.1:{port}"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    node_cmd = launch.node_command(
        port, f"grpc://127.0.0.1:{worker_port}", model_dir, ["--processes", "1", *args.node_arg]
    )
    with (
        launch.running("sim-worker", launch.sim_worker_command(worker_port, model_dir), out / "sim.log") as worker,
        launch.running("smg-node", node_cmd, out / "node.log") as node,
    ):
        launch.wait_port(worker, worker_port, 60.0)
        model = launch.wait_gateway_ready(node, base_url, pool, 90.0)

        def load(first: int, duration_s: float) -> ChatLoad:
            return ChatLoad(base_url, model, pool, args.output, args.concurrency, duration_s, first, 0, 60.0)

        run_point(load(1000, 2.0))
        launch.wait_idle(node, 10.0)
        target = worker if args.target == "sim" else node
        spy = None
        collapsed = out / f"{args.folder}-{args.corpus}-{args.prompt}-{args.output}-c{args.concurrency}-{stamp}.txt"
        if args.py_spy != "none":
            cmd = [args.py_spy, "record", "--format", "raw", "--rate", str(PY_SPY_RATE_HZ), "-o", str(collapsed)]
            cmd += ["--native"] if args.native else []
            cmd += ["--gil"] if args.gil else []
            spy = subprocess.Popen([*cmd, "--pid", str(target.pid)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            time.sleep(ATTACH_WAIT_S)
        perf = None
        perf_data = collapsed.with_suffix(".perf.data")
        if args.perf:
            perf = subprocess.Popen(
                ["perf", "record", "-q", "-F", "499", "-g", "-o", str(perf_data), "-p", str(target.pid)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(ATTACH_WAIT_S)
        tree = sample_tree(node.pid)
        before, threads_before = tree.cpu_s, thread_cpu_s(tree.pids)
        sim_before = sample_tree(worker.pid).cpu_s
        result = run_point(load(1_000_000, args.duration_s))
        used = sample_tree(node.pid).cpu_s - before
        sim_used = sample_tree(worker.pid).cpu_s - sim_before
        threads_after = thread_cpu_s(tree.pids)
        if perf is not None:
            perf.send_signal(2)
            perf.wait(60)
        if spy is not None:
            spy.send_signal(2)
            spy.wait(30)
    requests = len(result.samples)
    per = 1000 / max(requests, 1)
    print(f"{requests} requests, {result.error_count} errors, node CPU {per * used:.3f} ms/req")
    print(f"simulated worker CPU {per * sim_used:.3f} ms/req")
    for name, seconds in sorted(threads_after.items(), key=lambda kv: -kv[1]):
        spent = seconds - threads_before.get(name, 0.0)
        if spent > 0:
            print(f"  thread {name:30} {1000 * spent / max(requests, 1):7.3f} ms/req")
    if args.perf and perf_data.exists():
        report = subprocess.run(
            ["perf", "report", "-i", str(perf_data), "--no-children", "--sort", "dso,sym", "--stdio", "-g", "none"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        print("\n".join(line for line in report.splitlines() if line.strip() and not line.startswith("#"))[:6000])
        print(f"perf data: {perf_data}")
    if spy is not None and collapsed.exists():
        print(summarize(collapsed))
        print(f"raw stacks: {collapsed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
