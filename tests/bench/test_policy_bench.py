"""The routing benchmarks: their tables without processes, and end to end with the real CLI, tiny runs.

The smg-node smoke run stands in for the full benchmark in the normal suite (~15 s); SMG's, the affinity
variants' and the --quick run are `slow`.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bench import affinity_bench, policy_bench
from bench.fleet import SimProfile, gateway_command
from bench.multiturn import RunStats
from bench.policy_bench import PolicyBenchConfig, PolicyRun
from bench.report import NODE, SMG

REPO = Path(__file__).resolve().parents[2]
TINY = (
    "--workers", "2",
    "--repeats", "1",
    "--rate", "8",
    "--duration-s", "4",
    "--warmup-s", "1",
    "--turns", "2,4",
    "--think-s", "0.5",
    "--system-prompts", "2",
)  # fmt: skip


def stats(ttft_p99_ms: float, hit_ratio: float) -> RunStats:
    values = dict.fromkeys(RunStats.__dataclass_fields__, 1.0)
    return RunStats(**{**values, "ttft_p99_ms": ttft_p99_ms, "hit_ratio": hit_ratio})  # type: ignore[arg-type]


def runs() -> list[PolicyRun]:
    table = {
        ("round_robin", NODE): [100.0, 120.0, 110.0],
        ("round_robin", SMG): [105.0, 100.0, 130.0],
        ("cache_aware", NODE): [40.0, 50.0, 60.0],
        ("cache_aware", SMG): [55.0, 45.0, 70.0],
    }
    return [
        PolicyRun(gateway, policy, rep, stats(p99, 0.9 if policy == "cache_aware" else 0.8), (), 1.0)
        for (policy, gateway), values in table.items()
        for rep, p99 in enumerate(values)
    ]


def test_tables_show_medians_ratios_and_the_issue_targets() -> None:
    summary = policy_bench.summarize(runs())
    assert summary[("cache_aware", NODE)].ttft_p99_ms == 50.0
    table = policy_bench.comparison_table(runs(), ("round_robin", "cache_aware"))
    # cache_aware: 50 / 55 node/SMG; vs round_robin 50 / 110 (-55%) and 55 / 105 (-48%).
    assert "| cache_aware | 1.00 | 0.91 | 1.00 | +0.000 | -55% | -48% |" in table
    targets = "\n".join(policy_bench.target_lines(runs()))
    assert "✅ smg-node cache_aware TTFT p99 ≤ 0.75 × its round_robin: 50.0 vs 110.0 ms (0.45×)" in targets
    assert "✅ smg-node cache_aware TTFT p99 ≤ SMG cache_aware: 50.0 vs 55.0 ms (0.91×)" in targets
    assert "| 40–60 |" in policy_bench.stats_table(runs(), ("cache_aware",), (NODE, SMG))
    assert "| cache_aware | smg-node | 50.0 | 1 | 1 | 1.0 | 1.0 |" in policy_bench.tail_table(
        runs(), ("cache_aware",), (NODE,)
    )


def test_gateway_commands_carry_the_policy_and_the_worker_profile() -> None:
    node = gateway_command(NODE, 8000, ["grpc://a:1", "grpc://b:1"], Path("/m"), "cache_aware", ["--seed", "1"])
    assert node[node.index("--policy") + 1] == "cache_aware"
    assert node[node.index("--processes") + 1] == "1"
    assert [node[i + 1] for i, arg in enumerate(node) if arg == "--worker"] == ["grpc://a:1", "grpc://b:1"]
    assert node[-2:] == ["--seed", "1"]
    smg = gateway_command(SMG, 8000, ["grpc://a:1", "grpc://b:1"], Path("/m"), "prefix_hash")
    assert smg[smg.index("--worker-urls") + 1 : smg.index("--worker-urls") + 3] == ["grpc://a:1", "grpc://b:1"]
    assert smg[smg.index("--policy") + 1] == "prefix_hash"
    flags = SimProfile(kv_events=False, cache_capacity_blocks=64).flags()
    assert "--no-kv-events" in flags
    assert flags[flags.index("--cache-capacity-blocks") + 1] == "64"


def test_cli_overrides_reach_the_config() -> None:
    config, _ = policy_bench.parse_args(["--policies", "random,cache_aware", "--rate", "5", "--no-kv-events"])
    assert config.policies == ("random", "cache_aware")
    assert config.workload.rate_rps == 5.0
    assert config.profile.kv_events is False
    assert config == replace(
        PolicyBenchConfig(),
        policies=("random", "cache_aware"),
        workload=replace(PolicyBenchConfig().workload, rate_rps=5.0),
        profile=replace(PolicyBenchConfig().profile, kv_events=False),
    )
    with pytest.raises(SystemExit):
        policy_bench.parse_args(["--policies", "fastest"])


def test_the_mesh_variant_joins_every_node_to_the_first() -> None:
    specs = affinity_bench.mesh(3)
    binds = [s.extra[s.extra.index("--mesh-bind") + 1] for s in specs]
    assert len(set(binds)) == 3
    assert "--join" not in specs[0].extra
    assert all(s.extra[s.extra.index("--join") + 1] == binds[0] for s in specs[1:])
    assert [len(affinity_bench.VARIANT_SPECS[v](3)) for v in ("single", "independent", "smg")] == [1, 3, 3]


def run_cli(module: str, out_dir: Path, *args: str, timeout_s: float) -> tuple[str, dict[str, Any]]:
    cmd = [sys.executable, "-m", module, "--out-dir", str(out_dir), *args]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout_s, check=False)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}"
    name = module.rsplit(".", 1)[1]
    return done.stdout, json.loads((out_dir / f"{name}-latest.json").read_text())


def assert_sane_run(record: dict[str, Any]) -> None:
    s = record["stats"]
    assert s["requests"] >= 10, s
    assert s["errors"] == 0, record["errors"]
    assert s["skipped"] == 0
    assert 0.3 < s["hit_ratio"] < 1.0, s  # the system prompts and earlier turns are cached
    assert 0 < s["ttft_p50_ms"] <= s["ttft_p99_ms"] <= s["latency_p99_ms"]
    assert not math.isnan(s["gateway_cpu_ms_per_req"])


def test_smoke_smg_node(tmp_path: Path) -> None:
    out, raw = run_cli(
        "bench.policy_bench", tmp_path, "--gateways", "smg-node", "--policies", "cache_aware", *TINY, timeout_s=60
    )
    assert raw["failures"] == []
    (run,) = raw["runs"]
    assert (run["gateway"], run["policy"]) == ("smg-node", "cache_aware")
    assert_sane_run(run)
    assert "| cache_aware | smg-node |" in out
    assert (tmp_path / "logs").is_dir()


@pytest.mark.slow
@pytest.mark.smg
def test_smoke_smg(tmp_path: Path) -> None:
    _, raw = run_cli(
        "bench.policy_bench", tmp_path, "--gateways", "SMG", "--policies", "cache_aware", *TINY, timeout_s=90
    )
    (run,) = raw["runs"]
    assert_sane_run(run)


@pytest.mark.slow
@pytest.mark.smg
def test_affinity_variants(tmp_path: Path) -> None:
    out, raw = run_cli(
        "bench.affinity_bench",
        tmp_path,
        "--variants", "single,independent,smg",
        "--gateways-per-variant", "2",
        "--workers", "2",
        "--rate", "8",
        "--duration-s", "4",
        "--warmup-s", "1",
        timeout_s=180,
    )  # fmt: skip
    assert raw["failures"] == []
    assert [(r["variant"], r["gateways"]) for r in raw["runs"]] == [("single", 1), ("independent", 2), ("smg", 2)]
    for run in raw["runs"]:
        assert run["stats"]["errors"] == 0, run["errors"]
    assert "| independent | 2 |" in out


@pytest.mark.slow
@pytest.mark.smg
@pytest.mark.timeout(600)
def test_quick_mode(tmp_path: Path) -> None:
    _, raw = run_cli("bench.policy_bench", tmp_path, "--quick", timeout_s=500)
    assert raw["failures"] == []
    assert len(raw["runs"]) == 2 * 2
    for run in raw["runs"]:
        assert run["stats"]["errors"] == 0, (run["gateway"], run["policy"], run["errors"])
