"""A fleet for routing benchmarks: N simulated workers with a realistic latency model, and gateways with a
policy in front of them. Processes come from `bench.launch` (own sessions, logs, bounded stops); everything
started here is stopped when the `ExitStack` it was entered on unwinds.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, fields
from pathlib import Path

from bench import launch, prompts
from bench.launch import LaunchError, Service
from bench.multiturn import RunStats, Workload, WorkloadResult, run_stats, run_workload
from bench.proc import machine_busy_s, own_cpu_s, sample_tree
from bench.prompts import PromptPool
from bench.report import NODE, SMG

GATEWAYS = (NODE, SMG)
# What a gateway's readiness probe sends: a short prompt sharing nothing with the workload.
PROBE_TOKENS = 64
# Longest wait for a gateway to fall idle after start-up.
SETTLE_TIMEOUT_S = 20.0


@dataclass(frozen=True, slots=True)
class SimProfile:
    """The simulated engine of every worker (see node/sim/README.md for what each knob does).

    Defaults: a small GPU where prefill dominates TTFT (a 2,000-token uncached prompt costs 5 + 160 ms), a
    ~7 ms decode step, and a prefix cache (1,536 blocks of 16 tokens = 24,576 tokens per worker) large
    enough for a quarter of the workload's conversations and system prompts, not for all of them: a policy
    that scatters a conversation over the workers evicts what its turns would have reused.
    """

    ttft_base_ms: float = 5.0
    ttft_per_uncached_token_ms: float = 0.08
    tpot_ms: float = 7.0
    tpot_per_running_ms: float = 0.05
    max_running_requests: int = 32
    block_size: int = 16
    cache_capacity_blocks: int = 1536
    tokens_per_chunk: int = 1
    kv_events: bool = True  # off: workers answer SubscribeKvEvents with UNIMPLEMENTED (approximate routing)

    def prefill_ms(self, uncached_tokens: int) -> float:
        """The engine's time to first token for a prompt with ``uncached_tokens`` not in its cache."""
        return self.ttft_base_ms + self.ttft_per_uncached_token_ms * max(0, uncached_tokens)

    def flags(self) -> list[str]:
        out: list[str] = []
        for f in fields(self):
            flag, value = f.name.replace("_", "-"), getattr(self, f.name)
            if isinstance(value, bool):
                out.append(f"--{flag}" if value else f"--no-{flag}")
            else:
                out += [f"--{flag}", str(value)]
        return out


@dataclass(frozen=True, slots=True)
class SimWorker:
    service: Service
    url: str  # grpc://127.0.0.1:PORT


def start_workers(
    stack: ExitStack, count: int, model_dir: Path, profile: SimProfile, log_dir: Path, timeout_s: float = 30.0
) -> list[SimWorker]:
    """Start ``count`` sim workers and wait until all listen.

    Raises:
        LaunchError: one exited or did not open its port in time.
    """
    started: list[tuple[Service, int]] = []
    for i in range(count):
        port = launch.free_port()
        cmd = launch.sim_worker_command(port, model_dir, profile.flags())
        started.append((stack.enter_context(launch.running(f"sim-{i}", cmd, log_dir / f"sim-{i}.log")), port))
    for service, port in started:
        launch.wait_port(service, port, timeout_s)
    return [SimWorker(service, f"grpc://127.0.0.1:{port}") for service, port in started]


def gateway_command(
    gateway: str, port: int, worker_urls: Sequence[str], model_dir: Path, policy: str, extra: Sequence[str] = ()
) -> list[str]:
    """``gateway`` (smg-node or SMG) with ``policy`` and its own defaults otherwise.

    smg-node runs as one process (its default with in-memory history; explicit here because routing state
    is per process). Both gateways' cache_aware defaults are the same: cache threshold 0.3, balance
    thresholds 64 requests / 1.5x, 16-token pages.
    """
    if gateway == NODE:
        return launch.node_command(port, worker_urls, model_dir, ["--policy", policy, "--processes", "1", *extra])
    if gateway == SMG:
        return launch.smg_command(port, worker_urls, model_dir, ["--policy", policy, *extra])
    raise ValueError(f"unknown gateway {gateway!r}; choose from {GATEWAYS}")


@dataclass(frozen=True, slots=True)
class Gateway:
    name: str
    service: Service
    url: str
    model: str
    ready_s: float  # from start to serving the probe


def probe_pool(model_dir: Path) -> PromptPool:
    tokenizer = prompts.load_tokenizer(model_dir)
    overhead = prompts.chat_template_overhead(model_dir, tokenizer)
    return prompts.build_pool(tokenizer, overhead, PROBE_TOKENS, count=1, seed=7)


def start_gateway(
    stack: ExitStack, name: str, cmd: Sequence[str], port: int, probe: PromptPool, log_path: Path, timeout_s: float
) -> Gateway:
    """Start a gateway, wait until it answers a probe request, then until it is idle.

    Raises:
        LaunchError: it exited or was not ready within ``timeout_s``.
    """
    started = time.monotonic()
    service = stack.enter_context(launch.running(name, cmd, log_path))
    url = f"http://127.0.0.1:{port}"
    model = launch.wait_gateway_ready(service, url, probe, timeout_s)
    ready_s = time.monotonic() - started
    launch.wait_idle(service, SETTLE_TIMEOUT_S)
    return Gateway(name, service, url, model, ready_s)


def measured_run(
    workload: Workload,
    gateways: Sequence[Gateway],
    workers: Sequence[SimWorker],
    profile: SimProfile,
    request_timeout_s: float,
) -> tuple[WorkloadResult, RunStats]:
    """Replay ``workload`` across ``gateways`` (each turn to a seeded random one) and measure it, with the
    gateways' CPU (their process trees, summed) and the CPU every other process on the machine used.

    Raises:
        LaunchError: a gateway died during the run.
    """
    pids = [g.service.pid for g in gateways] + [w.service.pid for w in workers]
    cpu0 = [sample_tree(pid).cpu_s for pid in pids]
    busy0, own0 = machine_busy_s(), own_cpu_s()
    result = run_workload(workload, [g.url for g in gateways], gateways[0].model, request_timeout_s=request_timeout_s)
    busy1, own1 = machine_busy_s(), own_cpu_s()
    cpu = [sample_tree(pid).cpu_s - before for pid, before in zip(pids, cpu0, strict=True)]
    for g in gateways:
        if not g.service.alive():
            raise LaunchError(f"{g.name} died during the run:\n{g.service.log_tail()}")
    other = max(0.0, (busy1 - busy0) - sum(cpu) - (own1 - own0))
    stats = run_stats(
        result,
        workload.config,
        gateway_cpu_s=sum(cpu[: len(gateways)]),
        other_cpu_s=other,
        prefill_ms=profile.prefill_ms,
    )
    return result, stats
