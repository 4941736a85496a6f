"""Where one smg-node process spends its CPU while streaming: py-spy on a node under a steady chat load.

    .venv/bin/python -m bench.stream_profile                       # 200/200, 16 clients, 8 s of samples
    .venv/bin/python -m bench.stream_profile --output 20 --concurrency 64
    .venv/bin/python -m bench.stream_profile --l1 --output 20      # the L1 workload of bench/l1_bench.py

One zero-latency `smg-node sim-worker` (the flags gateway_bench uses) and one `smg-node serve --processes 1`;
a closed loop of streaming chat clients (bench/load.py) while `py-spy record -f raw` samples every thread of
the node. The summary attributes each sample of the event-loop thread to the first frame on its stack that
matches a bucket below (innermost first), and reports the other threads' share of the process's samples.
Also prints the node's CPU per request and per output token over the sampled window (py-spy's own
overhead included, so read it as relative, not as the gateway_bench figure).
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from bench import l1_bench, launch, prompts
from bench.load import ChatLoad, Sample, run_point
from bench.proc import sample_tree

BENCH_DIR = Path(__file__).resolve().parent
DEFAULT_OUT_DIR = BENCH_DIR / "out" / "profile"
SAMPLE_RATE_HZ = 250

# (bucket, substrings of a frame "function (file:line)"), tried innermost frame first: the first frame that
# matches names the bucket. Order matters where one bucket's frames call another's.
BUCKETS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("SSE write syscall (transport write)", ("_writelines (aiohttp", "_write (aiohttp", "write_eof (aiohttp")),
    ("grpc.aio read (await machinery, parse)", ("_read (grpc/aio", "receive_serialized_message")),
    ("protobuf -> WorkerOutput", ("_output (node/workers/vllm_grpc",)),
    ("detokenize", ("detokenize.py",)),
    ("pipeline dispatch + output", ("node/pipeline/dispatch.py", "node/pipeline/output.py")),
    ("SSE framing", ("node/http/sse.py",)),
    ("chat/completions handler", ("node/http/openai_chat.py", "node/http/openai_completions.py")),
    ("chat template", ("node/pipeline/template", "jinja2/")),
    ("tokenize (incl. caches)", ("node/pipeline/tokeniz", "node/pipeline/token_cache", "node/pipeline/bpe_fast")),
    ("aiohttp request handling", ("aiohttp/",)),
    ("grpc.aio other", ("grpc/",)),
    ("uvloop run / idle", ("run_forever", "run_until_complete", "<module>")),
)


@dataclass(frozen=True, slots=True)
class Done:
    samples: tuple[Sample, ...]
    error_count: int
    wall_s: float


def bucket_of(frames: Sequence[str]) -> str:
    """The bucket of one stack (outermost frame first, as py-spy's raw format writes it)."""
    for frame in reversed(frames):
        for name, needles in BUCKETS:
            if any(needle in frame for needle in needles):
                return name
    return "other"


def summarize(raw: str) -> tuple[dict[str, int], dict[str, int]]:
    """(event-loop thread samples per bucket, samples per thread) from py-spy's ``-f raw`` output."""
    loop: dict[str, int] = collections.Counter()
    threads: dict[str, int] = collections.Counter()
    for line in raw.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        thread = frames[0]
        threads[thread] += count
        if "MainThread" in thread or "main" in thread.lower():
            loop[bucket_of(frames[1:])] += count
    return dict(loop), dict(threads)


def _table(counts: dict[str, int]) -> list[str]:
    total = sum(counts.values()) or 1
    rows = ["| where | share |", "|---|---|"]
    rows += [f"| {name} | {100 * n / total:.0f} % |" for name, n in sorted(counts.items(), key=lambda kv: -kv[1])]
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.stream_profile", description=__doc__)
    parser.add_argument("--prompt", type=int, default=200, help="prompt tokens [200]")
    parser.add_argument("--output", type=int, default=200, help="output tokens [200]")
    parser.add_argument("--concurrency", type=int, default=16, help="streaming clients [16]")
    parser.add_argument("--duration-s", type=float, default=8.0, help="seconds of sampled load [8]")
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR)
    parser.add_argument("--no-py-spy", action="store_true", help="only measure CPU per request")
    parser.add_argument(
        "--l1", action="store_true", help="bench/l1_bench.py's multi-turn workload instead of --prompt-sized chats"
    )
    parser.add_argument("--native", action="store_true", help="py-spy --native: C/C++ frames too (slower)")
    args = parser.parse_args(argv)
    py_spy = shutil.which("py-spy") or str(launch.bin_dir() / "py-spy")
    out: Path = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    model_dir = launch.prepare_model(out / "models")
    tokenizer = prompts.load_tokenizer(model_dir)
    overhead = prompts.chat_template_overhead(model_dir, tokenizer)
    pool = prompts.build_pool(tokenizer, overhead, args.prompt, 16)
    workload = (
        l1_bench.build_workload(replace(l1_bench.L1Config(), output_tokens=args.output), tokenizer) if args.l1 else None
    )
    worker_port, node_port = launch.free_port(), launch.free_port()
    base_url = f"http://127.0.0.1:{node_port}"
    worker_cmd = launch.sim_worker_command(worker_port, model_dir)
    node_cmd = [*launch.node_command(node_port, f"grpc://127.0.0.1:{worker_port}", model_dir), "--processes", "1"]
    with (
        launch.running("sim-worker", worker_cmd, out / "sim-worker.log") as worker,
        launch.running("smg-node", node_cmd, out / "smg-node.log") as node,
    ):
        launch.wait_port(worker, worker_port, 60)
        model = launch.wait_gateway_ready(node, base_url, pool, 90)
        number = 1000

        def load(duration_s: float) -> Done:
            nonlocal number
            if workload is not None:
                point = l1_bench.run_point(base_url, model, workload, args.concurrency, duration_s, number, 60.0)
                number = point.next_conversation
                return Done(tuple(point.samples), point.error_count, point.wall_s)
            result = run_point(
                ChatLoad(base_url, model, pool, args.output, args.concurrency, duration_s, first_number=number)
            )
            number = result.next_number
            return Done(result.samples, result.error_count, result.wall_s)

        load(2.0)  # warm-up
        launch.wait_idle(node, 20)
        # The node's serving process: the supervisor's only child with --processes 1, else the node itself.
        children = Path(f"/proc/{node.pid}/task/{node.pid}/children").read_text().split()
        target = int(children[0]) if children else node.pid
        raw_path = out / f"py-spy-{'l1' if args.l1 else args.prompt}-{args.output}-c{args.concurrency}.txt"
        spy: subprocess.Popen[bytes] | None = None
        if not args.no_py_spy:
            spy = subprocess.Popen(
                [py_spy, "record", "-p", str(target), "-t", "-r", str(SAMPLE_RATE_HZ), "-f", "raw",
                 "-d", str(int(args.duration_s)), "-o", str(raw_path),
                 *(["--native"] if args.native else ["--nonblocking"])],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            )  # fmt: skip
            time.sleep(0.5)
        cpu0 = sample_tree(node.pid).cpu_s
        result: list[Done] = []
        runner = threading.Thread(target=lambda: result.append(load(args.duration_s)))
        runner.start()
        runner.join()
        cpu1 = sample_tree(node.pid).cpu_s
        if spy is not None:
            _, err = spy.communicate(timeout=60)
            if spy.returncode:
                print(f"py-spy failed: {err.decode(errors='replace')}", file=sys.stderr)
                return 1
    done = result[0]
    requests = len(done.samples)
    tokens = sum(s.completion_tokens for s in done.samples)
    print(
        f"{'L1' if args.l1 else args.prompt}/{args.output} c{args.concurrency}: {requests / done.wall_s:.1f} req/s, "
        f"errors {done.error_count}"
    )
    if requests:
        print(
            f"node CPU {1000 * (cpu1 - cpu0) / requests:.2f} ms/req, "
            f"{1e6 * (cpu1 - cpu0) / max(tokens, 1):.1f} µs/token"
        )
    if spy is None:
        return 0
    loop, threads = summarize(raw_path.read_text())
    total = sum(threads.values()) or 1
    print(f"\nraw samples: {raw_path}\n\nevent-loop thread ({sum(loop.values())} samples):")
    print("\n".join(_table(loop)))
    print("\nthreads (share of all samples; py-spy samples idle threads too unless --idle is off):")
    for thread, n in sorted(threads.items(), key=lambda kv: -kv[1]):
        print(f"- {thread}: {100 * n / total:.0f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
