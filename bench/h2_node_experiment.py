"""What smg-node's CPU per request would be if Generate streams were read without grpc.aio: an experiment.

    .venv/bin/python -m bench.h2_node_experiment                       # 200/200 and 200/20, c1/c16, 3 reps
    .venv/bin/python -m bench.h2_node_experiment --output 200 --concurrency 16 --reps 5
    .venv/bin/python -m bench.h2_node_experiment --l1 --concurrency 1,16,64      # bench/l1_bench.py's workload

Two builds of the same node in front of one zero-latency `smg-node sim-worker`, one at a time, alternating:
``grpc-aio`` is `smg-node serve --processes 1` as shipped; ``h2`` is the same node started through this
module, which first replaces `VllmGrpcClient.generate` with a reader on bench/h2_proto.py (one HTTP/2
connection per worker, frames parsed on the event loop, every message that arrived together taken at once).
Everything else (unary RPCs, health, the pipeline, SSE) is unchanged. The prototype reads only the happy path
(no grpc-status check, no cancellation), so the answers are checked for their exact token count.

CPU is the node process's utime+stime from /proc over each point, divided by completed requests.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import AsyncGenerator, Sequence
from pathlib import Path

from bench import l1_bench, launch, prompts
from bench.load import ChatLoad, run_point
from bench.proc import sample_tree

BENCH_DIR = Path(__file__).resolve().parent
DEFAULT_OUT_DIR = BENCH_DIR / "out" / "h2_experiment"
VARIANTS = ("grpc-aio", "h2")


def _patch_generate() -> None:
    """Replace VllmGrpcClient.generate with the prototype reader (in this process only)."""
    import asyncio

    from smg_grpc_proto.generated import vllm_engine_pb2 as pb

    from bench import h2_proto
    from node.config import parse_worker_url
    from node.workers import vllm_grpc
    from node.workers.types import WorkerOutput, WorkerRequest

    connections: dict[str, h2_proto.H2GrpcConnection] = {}
    lock = asyncio.Lock()
    original = vllm_grpc.VllmGrpcClient.generate

    async def generate(self: vllm_grpc.VllmGrpcClient, request: WorkerRequest) -> AsyncGenerator[WorkerOutput, None]:
        if request.kv_transfer_params_json is not None:  # not what this experiment measures
            async for out in original(self, request):
                yield out
            return
        async with lock:
            conn = connections.get(self.url)
            if conn is None:
                host, _, port = parse_worker_url(self.url).rpartition(":")
                conn = connections[self.url] = await h2_proto.connect(host, int(port))
        msg = pb.GenerateRequest(
            request_id=request.request_id,
            tokenized=pb.TokenizedInput(input_ids=request.prompt_ids),
            sampling_params=vllm_grpc._sampling_params(request.params),
            stream=request.stream,
        )
        stream = conn.open("/vllm.grpc.engine.VllmEngine/Generate", msg.SerializeToString())
        async for batch in conn.messages_of(stream):
            for data in batch:
                yield vllm_grpc._output(pb.GenerateResponse.FromString(data))

    vllm_grpc.VllmGrpcClient.generate = generate  # type: ignore[method-assign]


def node_command(variant: str, port: int, worker_url: str, model_dir: Path) -> list[str]:
    cmd = [*launch.node_command(port, worker_url, model_dir), "--processes", "1"]
    if variant == "h2":
        return [sys.executable, "-m", "bench.h2_node_experiment", "--serve", *cmd[1:]]
    return cmd


def main(argv: Sequence[str] | None = None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    if raw[:1] == ["--serve"]:  # the h2 node process: patch, then run `smg-node serve ...` in-process
        _patch_generate()
        from node.cli import main as node_main

        return node_main(raw[1:])
    parser = argparse.ArgumentParser(prog="python -m bench.h2_node_experiment", description=__doc__)
    parser.add_argument("--prompt", type=int, default=200)
    parser.add_argument("--output", type=lambda s: tuple(int(x) for x in s.split(",")), default=(200, 20))
    parser.add_argument("--concurrency", type=lambda s: tuple(int(x) for x in s.split(",")), default=(1, 16))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--duration-s", type=float, default=5.0)
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR)
    parser.add_argument("--l1", action="store_true", help="bench/l1_bench.py's multi-turn workload instead")
    args = parser.parse_args(raw)
    out: Path = args.out_dir
    model_dir = launch.prepare_model(out / "models")
    tokenizer = prompts.load_tokenizer(model_dir)
    pool = prompts.build_pool(tokenizer, prompts.chat_template_overhead(model_dir, tokenizer), args.prompt, 16)
    l1_config = l1_bench.L1Config()
    workload = l1_bench.build_workload(l1_config, tokenizer) if args.l1 else None
    if workload is not None:
        args.output = (l1_config.output_tokens,)
    worker_port = launch.free_port()
    worker_url = f"grpc://127.0.0.1:{worker_port}"
    label = "L1" if args.l1 else str(args.prompt)
    cpu: dict[tuple[str, int, int], list[float]] = {}
    rates: dict[tuple[str, int, int], list[float]] = {}
    number = 1000
    with launch.running("sim-worker", launch.sim_worker_command(worker_port, model_dir), out / "sim.log") as worker:
        launch.wait_port(worker, worker_port, 60)
        for rep in range(args.reps):
            for variant in VARIANTS if rep % 2 == 0 else tuple(reversed(VARIANTS)):
                port = launch.free_port()
                base_url = f"http://127.0.0.1:{port}"
                cmd = node_command(variant, port, worker_url, model_dir)
                with launch.running(variant, cmd, out / f"{variant}-{rep}.log") as node:
                    model = launch.wait_gateway_ready(node, base_url, pool, 90)
                    number = run_point(ChatLoad(base_url, model, pool, 20, 8, 1.5, number)).next_number
                    launch.wait_idle(node, 20)
                    for output in args.output:
                        for conc in args.concurrency:
                            cpu0 = sample_tree(node.pid).cpu_s
                            if workload is not None:
                                point = l1_bench.run_point(
                                    base_url, model, workload, conc, args.duration_s, number, 60.0
                                )
                                number = point.next_conversation
                                samples, errors, wall_s = point.samples, point.error_count, point.wall_s
                            else:
                                result = run_point(
                                    ChatLoad(base_url, model, pool, output, conc, args.duration_s, number)
                                )
                                number = result.next_number
                                samples, errors, wall_s = list(result.samples), result.error_count, result.wall_s
                            cpu1 = sample_tree(node.pid).cpu_s
                            done = len(samples)
                            bad = sum(1 for s in samples if s.completion_tokens != output)
                            key = (variant, output, conc)
                            cpu.setdefault(key, []).append(1000 * (cpu1 - cpu0) / max(done, 1))
                            rates.setdefault(key, []).append(done / wall_s)
                            print(
                                f"rep {rep} {variant:8} {label}/{output} c{conc}: {done / wall_s:6.1f} "
                                f"req/s, {cpu[key][-1]:6.2f} ms CPU/req, errors {errors}, bad tok {bad}",
                                file=sys.stderr,
                            )
    print("\n| prompt/out | conc | grpc-aio CPU ms/req | h2 CPU ms/req | h2 / grpc-aio | req/s × | reps |")
    print("|---|---|---|---|---|---|---|")
    for output in args.output:
        for conc in args.concurrency:
            a, b = (statistics.median(cpu[(v, output, conc)]) for v in VARIANTS)
            ra, rb = (statistics.median(rates[(v, output, conc)]) for v in VARIANTS)
            print(f"| {label}/{output} | {conc} | {a:.2f} | {b:.2f} | {b / a:.2f} | {rb / ra:.2f} | {args.reps} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
