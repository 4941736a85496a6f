"""System calls per streamed request, smg-node vs SMG: `strace -c -f` on each gateway under the same load.

    .venv/bin/python -m bench.syscall_count                      # 200/200, 16 clients, 4 s per gateway
    .venv/bin/python -m bench.syscall_count --output 20 --concurrency 1

One zero-latency `smg-node sim-worker` (gateway_bench's flags); each gateway in turn (smg-node with
`--processes 1`, so one process carries the load) gets a 2 s warm-up, then `strace -c -f` attaches to its
serving process for a ``--duration-s`` closed loop of streaming chat clients. Printed: each system call
made at least once per request, per completed request. strace slows the traced process down a lot, so
read the counts, not the rates.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from bench import launch, prompts
from bench.load import ChatLoad, run_point

BENCH_DIR = Path(__file__).resolve().parent
DEFAULT_OUT_DIR = BENCH_DIR / "out" / "syscalls"


def per_request(strace_summary: str, requests: int) -> dict[str, float]:
    """System calls per request from `strace -c` output (its table: % time, seconds, usecs/call, calls, ...)."""
    counts: dict[str, float] = {}
    for line in strace_summary.splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[3].isdigit():
            counts[parts[-1]] = int(parts[3]) / max(requests, 1)
    return counts


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.syscall_count", description=__doc__)
    parser.add_argument("--prompt", type=int, default=200)
    parser.add_argument("--output", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--duration-s", type=float, default=4.0)
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR)
    args = parser.parse_args(argv)
    out: Path = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    model_dir = launch.prepare_model(out / "models")
    tokenizer = prompts.load_tokenizer(model_dir)
    pool = prompts.build_pool(tokenizer, prompts.chat_template_overhead(model_dir, tokenizer), args.prompt, 8)
    worker_port = launch.free_port()
    worker_url = f"grpc://127.0.0.1:{worker_port}"
    number = 1000
    with launch.running("sim-worker", launch.sim_worker_command(worker_port, model_dir), out / "sim.log") as worker:
        launch.wait_port(worker, worker_port, 60)
        for gateway, command in launch.GATEWAY_COMMANDS.items():
            port = launch.free_port()
            base_url = f"http://127.0.0.1:{port}"
            cmd = command(port, worker_url, model_dir)
            if gateway == "smg-node":
                cmd = [*cmd, "--processes", "1"]
            with launch.running(gateway, cmd, out / f"{gateway}.log") as service:
                model = launch.wait_gateway_ready(service, base_url, pool, 90)
                warm = run_point(ChatLoad(base_url, model, pool, args.output, args.concurrency, 2.0, number))
                number = warm.next_number
                launch.wait_idle(service, 20)
                children = Path(f"/proc/{service.pid}/task/{service.pid}/children").read_text().split()
                pid = int(children[0]) if gateway == "smg-node" and children else service.pid
                summary = out / f"{gateway}.strace"
                tracer = subprocess.Popen(
                    ["strace", "-c", "-f", "-p", str(pid), "-o", str(summary)],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )  # fmt: skip
                time.sleep(1.0)
                result = run_point(
                    ChatLoad(base_url, model, pool, args.output, args.concurrency, args.duration_s, number)
                )
                number = result.next_number
                tracer.send_signal(signal.SIGINT)
                tracer.wait(timeout=30)
            requests = len(result.samples)
            counts = per_request(summary.read_text(), requests)
            total = counts.pop("total", sum(counts.values()))
            print(f"{gateway}: {requests} requests ({args.prompt}/{args.output}, c{args.concurrency}), "
                  f"{total:,.1f} system calls per request")  # fmt: skip
            for name, n in sorted(counts.items(), key=lambda kv: -kv[1]):
                if n >= 1.0:
                    print(f"  {name:14} {n:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
