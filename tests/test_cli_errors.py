"""Operator mistakes on the command line get one clear line and a non-zero exit, never a traceback; waits
over a second print progress. Real processes, as an operator runs them."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.procs import REPO, SMG_NODE, free_port, http_status, port_open, process, wait_until


def _run(args: list[str], timeout_s: float = 60, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SMG_NODE, *args],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, **(env or {})},
    )


def _one_clear_line(result: subprocess.CompletedProcess[str], *phrases: str) -> str:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    for phrase in phrases:
        assert phrase in errors[0], errors[0]
    return errors[0]


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def test_serve_on_a_port_in_use(busy_port: int, llama3_model_dir: Path) -> None:
    result = _run(["serve", "--port", str(busy_port), "--model-path", str(llama3_model_dir)])
    _one_clear_line(result, "address already in use", str(busy_port))


def test_sim_worker_on_a_port_in_use(busy_port: int, llama3_model_dir: Path) -> None:
    result = _run(["sim-worker", "--port", str(busy_port), "--model-path", str(llama3_model_dir)])
    _one_clear_line(result, "cannot bind", str(busy_port))


def test_serve_with_bad_paths(llama3_model_dir: Path, tmp_path: Path) -> None:
    port = str(free_port())
    _one_clear_line(_run(["serve", "--port", port, "--model-path", str(tmp_path / "nope")]), "does not exist")
    mesh = ["--mesh-bind", f"127.0.0.1:{free_port()}", "--mesh-key-file", str(tmp_path / "no.keys")]
    _one_clear_line(_run(["serve", "--port", port, "--model-path", str(llama3_model_dir), *mesh]), "no.keys")


def test_serve_with_an_advertise_name_is_one_config_error(llama3_model_dir: Path) -> None:
    """Members gossip literal addresses: a name to advertise is refused at once, by name, with usage (exit 2)."""
    mesh = ["--mesh-bind", f"0.0.0.0:{free_port()}", "--mesh-advertise", "nosuchhost.invalid:7946"]
    result = _run(["serve", "--port", str(free_port()), "--model-path", str(llama3_model_dir), *mesh])
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "mesh_advertise" in result.stderr.splitlines()[-1]


def test_keygen_writes_once_and_keeps(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "mesh.keys"
    assert _run(["keygen", str(path)]).returncode == 0
    first = path.read_text()
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert _run(["keygen", str(path)]).returncode == 0
    assert path.read_text() == first, "an existing key must be kept: every node reads the same file"
    _one_clear_line(_run(["keygen", "/proc/nope/mesh.keys"]), "cannot write")


def test_serve_prints_progress_while_a_worker_does_not_answer(llama3_model_dir: Path, tmp_path: Path) -> None:
    http = free_port()
    args = [*SMG_NODE, "serve", "--port", str(http), "--model-path", str(llama3_model_dir)]
    args += ["--worker", f"grpc://127.0.0.1:{free_port()}", "--startup-wait-s", "6"]
    with process(args, log=tmp_path / "node.log"):
        wait_until(lambda: http_status(f"http://127.0.0.1:{http}/health") == 200, timeout_s=30, what="serving")
    lines = [line for line in (tmp_path / "node.log").read_text().splitlines() if "waiting for a worker" in line]
    assert len(lines) >= 2, "a line after one second, then every two"
    assert "GetModelInfo" in lines[0] and "of 6 s" in lines[0]


def test_join_to_a_dead_peer_prints_progress_then_one_error(llama3_model_dir: Path, tmp_path: Path) -> None:
    http = free_port()
    args = [*SMG_NODE, "serve", "--port", str(http), "--model-path", str(llama3_model_dir)]
    args += ["--mesh-bind", f"127.0.0.1:{free_port()}", "--mesh-profile", "local"]
    with process(args, log=tmp_path / "node.log"):
        wait_until(lambda: port_open(http), timeout_s=30, what="serving")
        started = time.monotonic()
        dead = f"127.0.0.1:{free_port()}"
        result = _run(["join", dead, "--node", f"http://127.0.0.1:{http}", "--timeout-s", "4"])
        assert time.monotonic() - started < 15
    progress = [line for line in result.stderr.splitlines() if line.startswith("waiting for")]
    assert progress and dead in progress[0], result.stderr
    _one_clear_line(result, "no answer within 4 s")


def test_sim_worker_and_serve_do_not_share_environment_variables(llama3_model_dir: Path, tmp_path: Path) -> None:
    """One environment for both (as in a container image): SMG_NODE_PORT is the node's, SMG_SIM_PORT the worker's."""
    node_port, sim_port = free_port(), free_port()
    env = {"SMG_NODE_PORT": str(node_port), "SMG_SIM_PORT": str(sim_port), "SMG_SIM_MODEL_PATH": str(llama3_model_dir)}
    with process([*SMG_NODE, "sim-worker"], log=tmp_path / "sim.log", env=env):
        wait_until(lambda: port_open(sim_port), timeout_s=30, what="the worker on SMG_SIM_PORT")
        assert not port_open(node_port)
