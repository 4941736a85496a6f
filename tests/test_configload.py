"""Typed config: defaults < YAML < environment < flags; a bad key or value is named."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from node import configload
from node.cli import build_parser, load_node_config
from node.config import NODE_SECTIONS, HttpConfig, NodeConfig, WorkerPoolConfig


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


def test_yaml_sections_per_component(tmp_path: Path) -> None:
    cfg = tmp_path / "node.yaml"
    cfg.write_text(
        "http: {port: 9001, max_body_bytes: 1234}\n"
        "workers: {workers: [grpc://a:1], health_interval_s: 3}\n"
        "routing: {policy: random}\n"
        "log: {log_format: json}\n"
    )
    config = load_node_config(_args("--config", str(cfg)))
    assert (config.http.port, config.http.max_body_bytes) == (9001, 1234)
    assert config.workers.workers == ("grpc://a:1",)
    assert config.workers.health_interval_s == 3.0
    assert config.routing.policy == "random"
    assert config.log.log_format == "json"


def test_sections_and_flat_keys_mix_and_flags_still_win(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "node.yaml"
    cfg.write_text("workers: [grpc://a:1]\nport: 9001\nrouting: {policy: random}\n")
    monkeypatch.setenv("SMG_NODE_POLICY", "least_load")
    config = load_node_config(_args("--config", str(cfg), "--port", "9003"))
    assert config.workers.workers == ("grpc://a:1",)  # a list under a section's name is the field
    assert config.http.port == 9003
    assert config.routing.policy == "least_load"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("http: {prot: 8000}\n", r"http\.prot"),
        ("http: {health_interval_s: 3}\n", r"http\.health_interval_s"),  # a key in another component's section
        ("mesh: {mesh_bind: '127.0.0.1:7946'}\n", "unknown config section 'mesh'"),
        ("port: 1\nhttp: {port: 2}\n", r"http\.port: also given as port"),
        ("http: {port: eighty}\n", "port"),
    ],
)
def test_bad_section_keys_are_named_with_their_section(tmp_path: Path, text: str, needle: str) -> None:
    cfg = tmp_path / "node.yaml"
    cfg.write_text(text)
    with pytest.raises(configload.ConfigError, match=needle):
        load_node_config(_args("--config", str(cfg)))


def test_every_section_is_a_node_config_field() -> None:
    assert tuple(NODE_SECTIONS) == tuple(f.name for f in dataclasses.fields(NodeConfig))
    flags = [field.name for cls in NODE_SECTIONS.values() for field in dataclasses.fields(cls)]
    assert len(flags) == len(set(flags)), "a field name in two components would make a flat YAML key ambiguous"


def test_demo_builds_its_config_through_the_same_loader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, llama3_model_dir: Path
) -> None:
    """`smg-node demo` reads --config, SMG_NODE_* and its flags like serve; only the workers are its own."""
    import contextlib
    import shutil
    from collections.abc import AsyncIterator

    import node.app
    import node.cli
    from node.cli import main

    models = tmp_path / "cache" / "smg-node" / "models"
    shutil.copytree(llama3_model_dir, models / "llama3")  # prepare_model reuses a complete folder
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("SMG_NODE_MAX_BODY_BYTES", "4321")
    cfg = tmp_path / "demo.yaml"
    cfg.write_text("routing: {policy: random}\n")
    seen: list[NodeConfig] = []

    class Stop(Exception):
        pass

    @contextlib.asynccontextmanager
    async def fake_run_node(config: NodeConfig, **_: object) -> AsyncIterator[None]:
        seen.append(config)
        raise Stop
        yield  # pragma: no cover

    monkeypatch.setattr(node.app, "run_node", fake_run_node)
    monkeypatch.setattr(node.cli, "setup_logging", lambda config: None)  # leave the test run's logging alone
    with pytest.raises(Stop):
        main(["demo", "--workers", "1", "--port", "0", "--config", str(cfg)])
    (config,) = seen
    assert config.routing.policy == "random"
    assert config.http.max_body_bytes == 4321
    assert config.http.port == 0
    assert config.model.model_path == (str(models / "llama3"),)
    (url,) = config.workers.workers
    assert url.startswith("grpc://127.0.0.1:")


def test_sim_worker_env_vars_are_its_own() -> None:
    """One environment configures a node and a worker (a container image): neither reads the other's."""
    import dataclasses

    from node import configload
    from node.config import NODE_SECTIONS, LogConfig
    from node.sim.config import SimWorkerConfig

    def names(cls: type) -> set[str]:
        return {configload.env_name(f, configload.env_prefix(cls)) for f in dataclasses.fields(cls)}

    node_vars = set().union(*(names(cls) for cls in NODE_SECTIONS.values()))
    shared = names(SimWorkerConfig) & node_vars
    assert not shared, f"sim-worker and serve share {sorted(shared)}"
    assert names(LogConfig) <= node_vars, "logging is deliberately shared"
    sim = configload.build(SimWorkerConfig, env={"SMG_NODE_PORT": "1", "SMG_SIM_PORT": "7000"})
    assert sim.port == 7000
    every = [
        configload.env_name(f, configload.env_prefix(c)) for c in NODE_SECTIONS.values() for f in dataclasses.fields(c)
    ]
    assert len(every) == len(set(every)), "two serve settings answer to one variable"
