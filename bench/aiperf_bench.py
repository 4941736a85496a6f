"""smg-node and SMG side by side under NVIDIA's `aiperf`: a second, independent load generator.

    .venv/bin/python -m bench.aiperf_bench --folder llama3-nobos --corpus prose     # 200,7800 x 20 x 1,16
    .venv/bin/python -m bench.aiperf_bench --aiperf ~/.cache/aiperf-venv/bin/aiperf --reps 3

aiperf is not a dependency of ours (its own pins clash with ours): install it into a separate environment,
``python -m venv ~/.cache/aiperf-venv && ~/.cache/aiperf-venv/bin/pip install aiperf==0.13.0``, and point
``--aiperf`` at its executable (that path is the default).

Same set-up as `bench.gateway_bench`: one zero-latency `sim-worker` shared by both gateways, which run one at
a time, restarted each repetition, order alternating; medians of the repetitions. aiperf sends the same
prompts our own generator would (`bench.corpora`, written to a ``single_turn`` JSONL file, each request's
text distinct, sampled sequentially without wrapping: one entry per request), streaming chat completions
of exactly N tokens (``ignore_eos``). It counts tokens with the folder's own tokenizer: with the hub
offline aiperf refuses a local path as ``--tokenizer``, so the folder is presented as a cached hub
repository (``smg-bench/<folder>``) under a private ``HF_HOME``. Gateway CPU is read from /proc around each
aiperf run and divided by the requests aiperf completed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from bench import corpora, folders, launch, prompts, report
from bench.corpora import CORPORA
from bench.folders import FOLDERS
from bench.load import ChatLoad, run_point
from bench.proc import sample_tree

DEFAULT_AIPERF = Path.home() / ".cache" / "aiperf-venv" / "bin" / "aiperf"
DEFAULT_OUT_DIR = Path(__file__).resolve().parent / "out" / "aiperf"
HUB_ORG = "smg-bench"
# A fixed fake revision: the snapshot folder name aiperf's hub client resolves "main" to.
HUB_REVISION = "0" * 40
# Requests per point: at least this many, and enough for ~`SECONDS_PER_POINT` at the expected rate.
MIN_REQUESTS = 200
MAX_REQUESTS = 3000
WARMUP_REQUESTS = 16
AIPERF_TIMEOUT_S = 900.0
# The metrics read from aiperf's profile_export_aiperf.json.
METRICS = ("request_throughput", "time_to_first_token", "request_latency", "request_count")


@dataclass(frozen=True, slots=True)
class PointResult:
    gateway: str
    repetition: int
    prompt_tokens: int
    output_tokens: int
    concurrency: int
    req_s: float
    ttft_p50_ms: float
    latency_p50_ms: float
    requests: int
    gateway_cpu_ms_per_req: float


def hub_cache(folder: Path, hf_home: Path, name: str) -> str:
    """Present ``folder`` as the cached hub repo ``smg-bench/<name>`` under ``hf_home``; return its id."""
    repo = hf_home / "hub" / f"models--{HUB_ORG}--{name}"
    snapshot = repo / "snapshots" / HUB_REVISION
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(HUB_REVISION)
    for file in folder.iterdir():
        if file.is_file() and not file.name.startswith("."):
            link = snapshot / file.name
            link.unlink(missing_ok=True)
            link.symlink_to(file.resolve())
    return f"{HUB_ORG}/{name}"


def write_dataset(path: Path, pool: prompts.PromptPool, first: int, count: int) -> None:
    with path.open("w", encoding="utf-8") as out:
        for number in range(first, first + count):
            out.write(json.dumps({"text": pool.text(number)}, ensure_ascii=False) + "\n")


def _stat(metrics: dict[str, object], name: str, stat: str) -> float:
    entry = metrics.get(name)
    if isinstance(entry, dict):
        value = entry.get(stat)
        if isinstance(value, int | float):
            return float(value)
    return float("nan")


def run_aiperf(
    aiperf: Path, url: str, model: str, tokenizer: str, hf_home: Path, dataset: Path, output_tokens: int,
    concurrency: int, requests: int, artifact_dir: Path,
) -> dict[str, object]:  # fmt: skip
    """Run one aiperf profile; return the metrics of its JSON export.

    Raises:
        launch.LaunchError: aiperf failed or wrote no export.
    """
    cmd = [
        str(aiperf), "profile",
        "--model", model,
        "--url", url,
        "--endpoint-type", "chat",
        "--streaming",
        "--tokenizer", tokenizer,
        "--input-file", str(dataset),
        "--custom-dataset-type", "single_turn",
        "--dataset-sampling-strategy", "sequential",
        "--concurrency", str(concurrency),
        "--request-count", str(requests),
        "--warmup-request-count", str(WARMUP_REQUESTS),
        "--output-tokens-mean", str(output_tokens),
        "--extra-inputs", f"max_tokens:{output_tokens}",
        "--extra-inputs", "ignore_eos:true",
        "--artifact-dir", str(artifact_dir),
        "--ui-type", "none",
        "--no-server-metrics",
        "--no-gpu-telemetry",
    ]  # fmt: skip
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=AIPERF_TIMEOUT_S, check=False)
    exports = sorted(artifact_dir.rglob("profile_export_aiperf.json"))
    if done.returncode != 0 or not exports:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
        raise launch.LaunchError(f"aiperf failed ({done.returncode}):\n{tail}")
    data = json.loads(exports[-1].read_text("utf-8"))
    return data.get("records", data) if isinstance(data, dict) else {}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.aiperf_bench", description=__doc__)
    parser.add_argument("--aiperf", type=Path, default=DEFAULT_AIPERF)
    parser.add_argument("--folder", choices=FOLDERS, default="llama3-nobos")
    parser.add_argument("--corpus", choices=CORPORA, default="prose")
    parser.add_argument("--gateways", default=f"{report.NODE},{report.SMG}")
    parser.add_argument("--prompts", default="200,7800")
    parser.add_argument("--outputs", default="20")
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--requests", type=int, default=600, help="requests per point (each a distinct prompt)")
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR)
    args = parser.parse_args(argv)
    launch.exit_on_sigterm()
    ints = lambda text: [int(x) for x in text.split(",") if x]  # noqa: E731
    gateways = [g.strip() for g in args.gateways.split(",")]
    requests = max(MIN_REQUESTS, min(MAX_REQUESTS, args.requests))
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out: Path = args.out_dir / stamp
    out.mkdir(parents=True, exist_ok=True)
    model_dir = folders.prepare(args.folder, args.out_dir / "models")
    tokenizer_id = hub_cache(model_dir, args.out_dir / "hf-home", args.folder)
    hf = prompts.load_tokenizer(model_dir)
    overhead = prompts.chat_template_overhead(model_dir, hf)
    datasets: dict[int, Path] = {}
    number = 1_000_000
    for size in ints(args.prompts):
        pool = corpora.build_pool(args.corpus, hf, overhead, size, 64)
        datasets[size] = out / f"prompts-{size}.jsonl"
        write_dataset(datasets[size], pool, number, requests + WARMUP_REQUESTS)
        number += 100_000
    results: list[PointResult] = []
    worker_port = launch.free_port()
    worker_url = f"grpc://127.0.0.1:{worker_port}"
    with launch.running("sim-worker", launch.sim_worker_command(worker_port, model_dir), out / "sim.log") as worker:
        launch.wait_port(worker, worker_port, 60.0)
        for rep in range(args.reps):
            for gateway in gateways if rep % 2 == 0 else list(reversed(gateways)):
                port = launch.free_port()
                cmd = launch.GATEWAY_COMMANDS[gateway](port, worker_url, model_dir)
                url = f"http://127.0.0.1:{port}"
                probe = corpora.build_pool("synthetic", hf, overhead, 200, 1)
                with launch.running(gateway, cmd, out / f"{gateway}-rep{rep}.log") as service:
                    model = launch.wait_gateway_ready(service, url, probe, 90.0)
                    run_point(ChatLoad(url, model, probe, 20, 4, 1.0, 10, 0, 30.0))
                    launch.wait_idle(service, 20.0)
                    for size in ints(args.prompts):
                        for output in ints(args.outputs):
                            for conc in ints(args.concurrency):
                                label = f"{gateway}-rep{rep}-{size}-{output}-c{conc}"
                                cpu0 = sample_tree(service.pid).cpu_s
                                metrics = run_aiperf(
                                    args.aiperf, url, model, tokenizer_id, args.out_dir / "hf-home",
                                    datasets[size], output, conc, requests, out / label,
                                )  # fmt: skip
                                cpu = sample_tree(service.pid).cpu_s - cpu0
                                count = _stat(metrics, "request_count", "avg")
                                done = int(count) if count == count else requests
                                result = PointResult(
                                    gateway, rep, size, output, conc,
                                    req_s=_stat(metrics, "request_throughput", "avg"),
                                    ttft_p50_ms=_stat(metrics, "time_to_first_token", "p50"),
                                    latency_p50_ms=_stat(metrics, "request_latency", "p50"),
                                    requests=done,
                                    # warm-up requests ran too: they are part of the CPU spent
                                    gateway_cpu_ms_per_req=1000 * cpu / max(done + WARMUP_REQUESTS, 1),
                                )  # fmt: skip
                                results.append(result)
                                print(f"[{time.strftime('%H:%M:%S')}] {label}: {result}", file=sys.stderr, flush=True)
    table = render(results, gateways, args)
    print(table)
    (out / "aiperf_bench.md").write_text(table, "utf-8")
    (out / "aiperf_bench.json").write_text(json.dumps([asdict(r) for r in results], indent=1), "utf-8")
    return 0


def render(results: list[PointResult], gateways: list[str], args: argparse.Namespace) -> str:
    keys = sorted({(r.prompt_tokens, r.output_tokens, r.concurrency) for r in results})
    lines = [
        f"- aiperf, folder `{args.folder}`, corpus `{args.corpus}`, {args.requests} requests per point, "
        f"medians of {args.reps} repetition(s)",
        "",
        "| prompt/out | conc | gateway | req/s | TTFT p50 ms | lat p50 ms | gw CPU ms/req |",
        "|---|---|---|---|---|---|---|",
    ]
    medians: dict[tuple[str, tuple[int, int, int]], tuple[float, float, float, float]] = {}
    for key in keys:
        for gateway in gateways:
            runs = [
                r for r in results if r.gateway == gateway and (r.prompt_tokens, r.output_tokens, r.concurrency) == key
            ]
            if not runs:
                continue
            m = (
                statistics.median(r.req_s for r in runs),
                statistics.median(r.ttft_p50_ms for r in runs),
                statistics.median(r.latency_p50_ms for r in runs),
                statistics.median(r.gateway_cpu_ms_per_req for r in runs),
            )
            medians[(gateway, key)] = m
            lines.append(
                f"| {key[0]}/{key[1]} | {key[2]} | {gateway} | {m[0]:.1f} | {m[1]:.2f} | {m[2]:.2f} | {m[3]:.2f} |"
            )
    if len(gateways) == 2:
        a, b = gateways
        lines += [
            "",
            f"| prompt/out | conc | req/s {a}/{b} | TTFT p50 Δ ms | CPU/req {a}/{b} |",
            "|---|---|---|---|---|",
        ]
        for key in keys:
            if (a, key) in medians and (b, key) in medians:
                x, y = medians[(a, key)], medians[(b, key)]
                lines.append(
                    f"| {key[0]}/{key[1]} | {key[2]} | {x[0] / y[0]:.2f} | {x[1] - y[1]:+.2f} | {x[3] / y[3]:.2f} |"
                )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
