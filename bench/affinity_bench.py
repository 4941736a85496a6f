"""Cache affinity across gateways (issue 5): the multi-turn workload with each turn sent to a random gateway.

    .venv/bin/python -m bench.affinity_bench                       # single, independent, smg, mesh (1 repetition)
    .venv/bin/python -m bench.affinity_bench --variants single,independent --gateways-per-variant 3
    .venv/bin/python -m bench.affinity_bench --quick               # short runs, smg-node variants only

The workload and workers are those of `bench.policy_bench` (`bench/multiturn.py`, `fleet.SimProfile`, 4 fresh
workers per run), except that the workers publish no KV events unless ``--kv-events``: with events, every
gateway subscribes to every worker and knows exactly what each caches, so independent gateways already route
as well as one (measured: same hit ratio), and only what gateways learn from their own routing decisions
(the approximate trees) is left for a mesh to share. The client picks a gateway for every request by a
seeded draw (the same sequence in every variant), so consecutive turns of a conversation usually land on
different gateways. Variants:

- ``single``: one smg-node, every request to it: the upper bound of what cache affinity can reach;
- ``independent``: N smg-node processes, no mesh: each knows only what it routed itself;
- ``smg``: N SMG gateways, independent (SMG has no shared index between gateways);
- ``mesh``: N smg-node processes in one mesh (``--mesh-bind``/``--join``): cache_aware shares compact hints of
  its routing decisions (prefix hash, pages, worker) with the other nodes, so each routes on what all learned.

Reported per variant: the workers' prefix hit ratio (usage.prompt_tokens_details.cached_tokens over
usage.prompt_tokens, the engines' own count), TTFT and end-to-end percentiles, and each variant's hit ratio
as a fraction of ``single``'s (issue 5's target: mesh ≥ 0.95).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from bench import fleet, launch, prompts, report
from bench.fleet import Gateway, SimProfile
from bench.launch import LaunchError, prepare_model
from bench.multiturn import RunStats, Workload, WorkloadConfig, build_workload, first_errors, write_records
from bench.prompts import PromptPool
from bench.report import NODE, SMG, fmt, ratio

BENCH_DIR = Path(__file__).resolve().parent
DEFAULT_OUT_DIR = BENCH_DIR / "out"
VARIANTS = ("single", "independent", "smg", "mesh")
DEFAULT_VARIANTS = VARIANTS
UPPER_BOUND = "single"
TARGET_MESH_VS_SINGLE = 0.95


@dataclass(frozen=True, slots=True)
class GatewaySpec:
    name: str  # smg-node or SMG: which command
    extra: tuple[str, ...]  # flags beyond the policy


def single(count: int) -> list[GatewaySpec]:
    return [GatewaySpec(NODE, ())]


def independent(count: int) -> list[GatewaySpec]:
    return [GatewaySpec(NODE, ()) for _ in range(count)]


def smg(count: int) -> list[GatewaySpec]:
    return [GatewaySpec(SMG, ()) for _ in range(count)]


def mesh(count: int) -> list[GatewaySpec]:
    """N smg-node processes joined into one mesh; node 0 is the seed the others join.

    Loopback timing profile; ports picked now (a race with other processes is possible but unlikely).
    """
    ports = [launch.free_port() for _ in range(count)]
    seed = f"127.0.0.1:{ports[0]}"
    specs = []
    for i, port in enumerate(ports):
        flags = ["--mesh-bind", f"127.0.0.1:{port}", "--mesh-profile", "local", "--node-name", f"node-{i}"]
        if i:
            flags += ["--join", seed]
        specs.append(GatewaySpec(NODE, tuple(flags)))
    return specs


VARIANT_SPECS: dict[str, Callable[[int], list[GatewaySpec]]] = {
    "single": single,
    "independent": independent,
    "smg": smg,
    "mesh": mesh,
}


@dataclass(frozen=True, slots=True)
class AffinityBenchConfig:
    variants: tuple[str, ...] = DEFAULT_VARIANTS
    gateways: int = 3  # per variant, except single
    policy: str = "cache_aware"
    workers: int = 4
    repeats: int = 1
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    # Without KV events: with them every gateway, meshed or not, reads the same engine events and knows what
    # every worker holds, so only the approximate trees (what each gateway routed) can differ between variants.
    profile: SimProfile = field(default_factory=lambda: SimProfile(kv_events=False))
    ready_timeout_s: float = 90.0
    request_timeout_s: float = 60.0
    out_dir: Path = DEFAULT_OUT_DIR


QUICK = AffinityBenchConfig(
    variants=("single", "independent"),
    workload=WorkloadConfig(rate_rps=10.0, duration_s=14.0, warmup_s=5.0),
)


@dataclass(frozen=True, slots=True)
class VariantRun:
    variant: str
    gateways: int
    repetition: int
    stats: RunStats
    errors: tuple[str, ...]


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def start_gateways(
    stack: ExitStack,
    specs: Sequence[GatewaySpec],
    worker_urls: Sequence[str],
    model_dir: Path,
    policy: str,
    probe: PromptPool,
    run_dir: Path,
    timeout_s: float,
) -> list[Gateway]:
    """Start every gateway at once (they load their tokenizers in parallel), then wait for each.

    Raises:
        LaunchError: one did not start or become ready.
    """
    started = []
    for i, spec in enumerate(specs):
        port = launch.free_port()
        cmd = fleet.gateway_command(spec.name, port, worker_urls, model_dir, policy, spec.extra)
        service = stack.enter_context(launch.running(f"{spec.name}-{i}", cmd, run_dir / f"gateway-{i}.log"))
        started.append((spec, service, port))
    out = []
    for spec, service, port in started:
        url = f"http://127.0.0.1:{port}"
        model = launch.wait_gateway_ready(service, url, probe, timeout_s)
        out.append(Gateway(spec.name, service, url, model, 0.0))
    for gateway in out:
        launch.wait_idle(gateway.service, fleet.SETTLE_TIMEOUT_S)
    return out


def run_variant(
    variant: str,
    repetition: int,
    config: AffinityBenchConfig,
    workload: Workload,
    model_dir: Path,
    probe: PromptPool,
    log_dir: Path,
) -> VariantRun:
    """Fresh workers, the variant's gateways, the whole workload spread over them; all stopped on return.

    Raises:
        LaunchError: a process did not start, or a gateway died during the run.
    """
    run_dir = log_dir / f"rep{repetition}-{variant}"
    specs = VARIANT_SPECS[variant](config.gateways)
    with ExitStack() as stack:
        workers = fleet.start_workers(stack, config.workers, model_dir, config.profile, run_dir)
        urls = [w.url for w in workers]
        gateways = start_gateways(stack, specs, urls, model_dir, config.policy, probe, run_dir, config.ready_timeout_s)
        result, stats = fleet.measured_run(workload, gateways, workers, config.profile, config.request_timeout_s)
    write_records(run_dir / "requests.jsonl", result)
    return VariantRun(variant, len(specs), repetition, stats, first_errors(result))


# --- reporting ---


def render(config: AffinityBenchConfig, runs: Sequence[VariantRun], failures: Sequence[str], command: str) -> str:
    w = config.workload
    groups: dict[str, list[RunStats]] = {}
    for run in runs:
        groups.setdefault(run.variant, []).append(run.stats)
    summary = {v: report.median_fields(RunStats, group) for v, group in groups.items()}
    sizes = {run.variant: run.gateways for run in runs}
    bound = summary.get(UPPER_BOUND)
    lines = [
        f"- date: {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- machine: {report.machine_line()}",
        f"- command: `{command}`",
        f"- versions: {report.versions_line()}",
        f"- policy {config.policy}; {config.workers} × `smg-node sim-worker {' '.join(config.profile.flags())}`, "
        "fresh for every run",
        f"- workload (seed {w.seed}): {w.rate_rps:g} req/s for {w.duration_s:g} s, {w.turns[0]}–{w.turns[1]} turns, "
        f"{w.system_prompts} system prompts; each turn to a seeded random gateway; first {w.warmup_s:g} s not "
        f"measured; medians of {config.repeats} repetition(s)",
        "",
        "| variant | gateways | hit ratio | hit ratio / single | TTFT p50 ms | TTFT p99 ms | e2e p50 ms "
        "| e2e p99 ms | ok | err | gw CPU ms/req |",
        "|" + "---|" * 11,
    ]
    for variant in config.variants:
        s = summary.get(variant)
        if s is None:
            continue
        share = ratio(s.hit_ratio, bound.hit_ratio) if bound is not None else math.nan
        cells = [
            variant,
            str(sizes[variant]),
            fmt(s.hit_ratio, 3),
            fmt(share, 3),
            fmt(s.ttft_p50_ms),
            fmt(s.ttft_p99_ms),
            fmt(s.latency_p50_ms),
            fmt(s.latency_p99_ms),
            fmt(s.requests, 0),
            fmt(s.errors, 0),
            fmt(s.gateway_cpu_ms_per_req),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    meshed = summary.get("mesh")
    if meshed is not None and bound is not None:
        share = ratio(meshed.hit_ratio, bound.hit_ratio)
        verdict = "✅" if share >= TARGET_MESH_VS_SINGLE else "❌"
        lines += ["", f"- {verdict} mesh hit ratio ≥ 0.95 × single: {share:.3f}×"]
    if failures:
        lines += ["", "Failures:", ""] + [f"- {f[:500]}" for f in failures]
    errors = sorted({e for run in runs for e in run.errors})
    if errors:
        lines += ["", "Request errors (first of each kind):", ""] + [f"- {e[:300]}" for e in errors[:10]]
    return "\n".join(lines) + "\n"


# --- command line ---


def parse_args(argv: Sequence[str] | None) -> AffinityBenchConfig:
    parser = argparse.ArgumentParser(
        prog="python -m bench.affinity_bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="single and independent, short runs")
    parser.add_argument("--variants", help=f"comma-separated subset of: {','.join(VARIANTS)}")
    parser.add_argument("--gateways-per-variant", type=int, help="gateways of the multi-gateway variants [3]")
    parser.add_argument("--policy", help="routing policy of every gateway [cache_aware]")
    parser.add_argument("--workers", type=int, help="simulated workers [4]")
    parser.add_argument("--repeats", type=int, help="repetitions; the table shows medians [1]")
    parser.add_argument("--rate", type=float, help="steady-state request rate, req/s [20]")
    parser.add_argument("--duration-s", type=float, help="seconds of arrivals per run [25]")
    parser.add_argument("--warmup-s", type=float, help="turns scheduled before this are not measured [8]")
    parser.add_argument("--seed", type=int, help="workload seed [0]")
    parser.add_argument(
        "--kv-events",
        action=argparse.BooleanOptionalAction,
        help="workers publish KV events (then every gateway sees every cache, mesh or not) [off]",
    )
    parser.add_argument("--out-dir", type=Path, help=f"where tables, raw JSON and logs go [{DEFAULT_OUT_DIR}]")
    args = parser.parse_args(argv)
    config = QUICK if args.quick else AffinityBenchConfig()
    top: dict[str, object] = {}
    if args.variants:
        names = tuple(name.strip() for name in args.variants.split(","))
        if unknown := [n for n in names if n not in VARIANTS]:
            parser.error(f"unknown variant(s) {unknown}; choose from {list(VARIANTS)}")
        top["variants"] = names
    for arg, name in (
        ("gateways_per_variant", "gateways"),
        ("policy", "policy"),
        ("workers", "workers"),
        ("repeats", "repeats"),
        ("out_dir", "out_dir"),
    ):
        if (value := getattr(args, arg)) is not None:
            top[name] = value
    work: dict[str, object] = {}
    for arg, name in (("rate", "rate_rps"), ("duration_s", "duration_s"), ("warmup_s", "warmup_s"), ("seed", "seed")):
        if (value := getattr(args, arg)) is not None:
            work[name] = value
    try:
        workload = replace(config.workload, **work)  # type: ignore[arg-type]
    except ValueError as exc:
        parser.error(str(exc))
    profile = config.profile if args.kv_events is None else replace(config.profile, kv_events=args.kv_events)
    return replace(config, workload=workload, profile=profile, **top)  # type: ignore[arg-type]


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(argv)
    launch.exit_on_sigterm()
    command = launch.command_line("bench.affinity_bench", argv)
    config.out_dir.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    log_dir = config.out_dir / "logs" / f"affinity-{stamp}"
    runs: list[VariantRun] = []
    failures: list[str] = []
    try:
        model_dir = prepare_model(config.out_dir / "models")
        workload = build_workload(config.workload, prompts.load_tokenizer(model_dir))
        probe = fleet.probe_pool(model_dir)
        _log(f"workload: {workload.requests} requests; variants {', '.join(config.variants)}")
        for repetition in range(config.repeats):
            for variant in config.variants:
                try:
                    run = run_variant(variant, repetition, config, workload, model_dir, probe, log_dir)
                except LaunchError as exc:
                    failures.append(f"repetition {repetition}, {variant}: {exc}")
                    _log(f"FAILED {variant} in repetition {repetition}: {exc}")
                    continue
                runs.append(run)
                s = run.stats
                _log(
                    f"rep {repetition} {variant:12} x{run.gateways} hit {s.hit_ratio:.3f}  ttft p50 "
                    f"{s.ttft_p50_ms:6.1f} p99 {s.ttft_p99_ms:6.1f} ms  ok {s.requests:.0f} err {s.errors:.0f}"
                )
    except (LaunchError, OSError, subprocess.SubprocessError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    block = render(config, runs, failures, command)
    print(block)
    raw = json.dumps(
        {
            "config": json.loads(json.dumps(asdict(config), default=str)),
            "failures": failures,
            "runs": [
                {
                    "variant": r.variant,
                    "gateways": r.gateways,
                    "repetition": r.repetition,
                    "stats": {k: (None if math.isnan(v) else v) for k, v in asdict(r.stats).items()},
                    "errors": list(r.errors),
                }
                for r in runs
            ],
        },
        indent=1,
    )
    report.save_outputs(config.out_dir, "affinity_bench", block, raw)
    return 1 if failures or not runs else 0


if __name__ == "__main__":
    sys.exit(main())
