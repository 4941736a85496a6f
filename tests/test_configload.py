"""Typed config: defaults < YAML < environment < flags; a bad key or value is named."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from node import configload
from node.cli import build_parser, load_node_config
from node.config import HttpConfig, WorkerPoolConfig


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["serve", "--model-path", "/m", *argv])


def test_precedence_defaults_yaml_env_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "node.yaml"
    cfg.write_text("port: 9001\nmax_body_bytes: 1234\nworkers: [grpc://a:1]\nhealth_interval_s: 7\n")
    monkeypatch.setenv("SMG_NODE_PORT", "9002")
    monkeypatch.setenv("SMG_NODE_HEALTH_INTERVAL_S", "8")
    config = load_node_config(_args("--config", str(cfg), "--health-interval-s", "9"))
    assert config.http.port == 9002  # env beats the file
    assert config.http.max_body_bytes == 1234  # the file beats the default
    assert config.workers.health_interval_s == 9.0  # the flag beats env
    assert config.workers.workers == ("grpc://a:1",)
    assert config.http.host == HttpConfig().host  # untouched default


def test_repeated_and_comma_separated_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    config = load_node_config(_args("--worker", "grpc://a:1", "--worker", "grpc://b:2,grpc://c:3"))
    assert config.workers.workers == ("grpc://a:1", "grpc://b:2", "grpc://c:3")
    monkeypatch.setenv("SMG_NODE_WORKERS", "grpc://x:1,grpc://y:2")
    assert load_node_config(_args()).workers.workers == ("grpc://x:1", "grpc://y:2")


@pytest.mark.parametrize(
    ("env", "value", "needle"),
    [
        ("SMG_NODE_PORT", "eighty", "SMG_NODE_PORT"),
        ("SMG_NODE_PORT", "70000", "port"),
        ("SMG_NODE_WORKERS", "http://a:1", "grpc://host:port"),
        ("SMG_NODE_POLICY", "fastest", "SMG_NODE_POLICY"),
    ],
)
def test_bad_values_are_named(monkeypatch: pytest.MonkeyPatch, env: str, value: str, needle: str) -> None:
    monkeypatch.setenv(env, value)
    with pytest.raises(configload.ConfigError, match=needle):
        load_node_config(_args())


def test_unknown_yaml_key_is_an_error(tmp_path: Path) -> None:
    cfg = tmp_path / "node.yaml"
    cfg.write_text("prot: 8000\n")
    with pytest.raises(configload.ConfigError, match="prot"):
        load_node_config(_args("--config", str(cfg)))


def test_cli_reports_config_errors_without_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    from node.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--model-path", "/m", "--worker", "tcp://nope"])
    assert exit_info.value.code == 2
    assert "grpc://host:port" in capsys.readouterr().err
    assert WorkerPoolConfig().workers == ()


def test_sim_worker_env_vars_are_its_own() -> None:
    """One environment configures a node and a worker (a container image): neither reads the other's."""
    import dataclasses

    from node import configload
    from node.config import NODE_COMPONENTS, LogConfig
    from node.sim.config import SimWorkerConfig

    def names(cls: type) -> set[str]:
        return {configload.env_name(f, configload.env_prefix(cls)) for f in dataclasses.fields(cls)}

    node_vars = set().union(*(names(cls) for cls in NODE_COMPONENTS))
    shared = names(SimWorkerConfig) & node_vars
    assert not shared, f"sim-worker and serve share {sorted(shared)}"
    assert names(LogConfig) <= node_vars, "logging is deliberately shared"
    sim = configload.build(SimWorkerConfig, env={"SMG_NODE_PORT": "1", "SMG_SIM_PORT": "7000"})
    assert sim.port == 7000
    every = [configload.env_name(f, configload.env_prefix(c)) for c in NODE_COMPONENTS for f in dataclasses.fields(c)]
    assert len(every) == len(set(every)), "two serve settings answer to one variable"
