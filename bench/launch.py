"""Start and stop the processes under test: the simulated worker and the two gateways.

Each process runs in its own session (so its process group holds everything it spawns), logs to a file, and
is stopped by `stop` with SIGTERM to the group, a bounded wait, then SIGKILL. `running` wraps that in a
context manager so every process is gone when the benchmark leaves; should the benchmark itself be killed,
each child gets SIGTERM from the kernel (PR_SET_PDEATHSIG). Every wait is bounded.
"""

from __future__ import annotations

import ctypes
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench.load import ChatLoad, run_point, served_models
from bench.proc import sample_tree
from bench.prompts import PromptPool

# SMG drains in-flight requests on SIGTERM for a few seconds; past this the group is killed.
STOP_GRACE_S = 10.0
READY_POLL_S = 0.2
PR_SET_PDEATHSIG = 1  # linux/prctl.h
# Zero-latency engine: the gateway's own overhead is all there is to measure. The prefix cache is off so the
# shared worker keeps no state from one gateway's run to the next.
SIM_ZERO_LATENCY_FLAGS = (
    "--ttft-base-ms", "0",
    "--ttft-per-uncached-token-ms", "0",
    "--tpot-ms", "0",
    "--tpot-per-running-ms", "0",
    "--cache-capacity-blocks", "0",
    "--tokens-per-chunk", "1",
)  # fmt: skip


class LaunchError(Exception):
    """A process did not start, exited early, or did not become ready in time."""


def bin_dir() -> Path:
    """The folder of this interpreter's console scripts (the venv's bin/)."""
    return Path(sys.executable).parent


REPO_DIR = Path(__file__).resolve().parent.parent
# smg-node as this checkout's code: the venv's `smg-node` script imports whichever checkout the venv was
# installed from (an editable install of another worktree would be benchmarked instead of this one).
SMG_NODE = (sys.executable, "-m", "node.cli")


def child_env() -> dict[str, str]:
    """The environment of every process started here: this checkout first on the import path."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": str(REPO_DIR) + (os.pathsep + path if path else "")}


@dataclass(slots=True)
class Service:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text("utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM when the benchmark dies, even by SIGKILL (Linux prctl)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: `stop` in `running` is the only cleanup
        pass


def start(name: str, cmd: Sequence[str], log_path: Path, cwd: Path | None = None) -> Service:
    """Start ``cmd`` in a new session, stdout and stderr to ``log_path``, in ``cwd`` (default: ours)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            list(cmd),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 - the driver starts processes from one thread
            env=child_env(),
            cwd=cwd,
        )
    return Service(name=name, process=process, log_path=log_path)


def stop(service: Service, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM the service's process group, wait up to ``grace_s``, then SIGKILL it."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(service.pid, sig)
        except ProcessLookupError:
            pass
        try:
            service.process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
        # The leader is gone; children that ignored SIGTERM still get SIGKILL via the group.
        try:
            os.killpg(service.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return


@contextmanager
def running(name: str, cmd: Sequence[str], log_path: Path, cwd: Path | None = None) -> Iterator[Service]:
    service = start(name, cmd, log_path, cwd)
    try:
        yield service
    finally:
        stop(service)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_port(service: Service, port: int, timeout_s: float) -> None:
    """Wait until 127.0.0.1:``port`` accepts connections.

    Raises:
        LaunchError: the service exited or the port stayed closed for ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not service.alive():
            raise LaunchError(f"{service.name} exited with {service.process.returncode}:\n{service.log_tail()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return
        except OSError:
            time.sleep(READY_POLL_S)
    raise LaunchError(f"{service.name} did not open port {port} in {timeout_s:.0f} s:\n{service.log_tail()}")


def wait_gateway_ready(
    service: Service, base_url: str, pool: PromptPool, timeout_s: float, headers: tuple[tuple[str, str], ...] = ()
) -> str:
    """Wait until the gateway lists a model and completes one streaming request (both sent with
    ``headers``); return the model id.

    Raises:
        LaunchError: the gateway exited, or was not ready within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    last = "no model listed"
    while time.monotonic() < deadline:
        if not service.alive():
            raise LaunchError(f"{service.name} exited with {service.process.returncode}:\n{service.log_tail()}")
        models = served_models(base_url, headers=headers)
        if models:
            probe = ChatLoad(
                base_url=base_url,
                model=models[0],
                pool=pool,
                max_tokens=4,
                concurrency=1,
                duration_s=5.0,
                first_number=0,
                max_requests=1,
                request_timeout_s=10.0,
                headers=headers,
            )
            result = run_point(probe)
            if result.samples:
                return models[0]
            last = "; ".join(result.errors)
        time.sleep(READY_POLL_S)
    raise LaunchError(f"{service.name} not ready in {timeout_s:.0f} s ({last}):\n{service.log_tail()}")


def wait_idle(service: Service, timeout_s: float, window_s: float = 0.5, busy_fraction: float = 0.05) -> None:
    """Wait until the service's process tree uses under ``busy_fraction`` of a core over ``window_s``.

    A gateway can answer before all of its processes finished starting (a second process loading its
    tokenizer); that work must not be billed to the first point. Gives up quietly after ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    before = sample_tree(service.pid).cpu_s
    while time.monotonic() < deadline:
        time.sleep(window_s)
        after = sample_tree(service.pid).cpu_s
        if after - before < busy_fraction * window_s:
            return
        before = after


def prepare_model(out_dir: Path, timeout_s: float = 120.0) -> Path:
    """Assemble the Llama-3 model folder with `smg-node models prepare`; return its path.

    Raises:
        LaunchError: the command failed.
    """
    cmd = [*SMG_NODE, "models", "prepare", "--family", "llama3", "--out", str(out_dir)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False, env=child_env())
    if done.returncode != 0:
        raise LaunchError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()}")
    return Path(done.stdout.strip().splitlines()[-1])


def sim_worker_command(port: int, model_dir: Path, flags: Sequence[str] = SIM_ZERO_LATENCY_FLAGS) -> list[str]:
    """A simulated worker; ``flags`` set its engine (default: zero latency, no prefix cache)."""
    return [
        *SMG_NODE,
        "sim-worker",
        "--host", "127.0.0.1",
        "--port", str(port),
        "--model-path", str(model_dir),
        *flags,
        "--log-level", "warning",
    ]  # fmt: skip


def _urls(worker_urls: str | Sequence[str]) -> list[str]:
    return [worker_urls] if isinstance(worker_urls, str) else list(worker_urls)


def node_command(port: int, worker_urls: str | Sequence[str], model_dir: Path, extra: Sequence[str] = ()) -> list[str]:
    """smg-node in front of ``worker_urls``, with ``extra`` flags (a policy, mesh flags) appended."""
    workers = [arg for url in _urls(worker_urls) for arg in ("--worker", url)]
    return [
        *SMG_NODE,
        "serve",
        "--host", "127.0.0.1",
        "--port", str(port),
        *workers,
        "--model-path", str(model_dir),
        "--log-level", "warning",
        *extra,
    ]  # fmt: skip


def smg_command(port: int, worker_urls: str | Sequence[str], model_dir: Path, extra: Sequence[str] = ()) -> list[str]:
    """SMG with its defaults, except: the log level matches smg-node's (warnings only); its Prometheus
    listener (default 0.0.0.0:29000) binds loopback on a free port so concurrent runs do not collide; and
    its shutdown grace is 1 s instead of 180 s (it is stopped only once its load is over, and otherwise
    lingers ~5 s per stop)."""
    return [
        str(bin_dir() / "smg"),
        "launch",
        "--backend", "vllm",
        "--worker-urls", *_urls(worker_urls),
        "--model-path", str(model_dir),
        "--tokenizer-path", str(model_dir),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--log-level", "warn",
        "--prometheus-host", "127.0.0.1",
        "--prometheus-port", str(free_port()),
        "--shutdown-grace-period-secs", "1",
        *extra,
    ]  # fmt: skip


GATEWAY_COMMANDS = {"smg-node": node_command, "SMG": smg_command}


def _raise_exit(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds the `running` blocks and ExitStacks, which stop every child


def exit_on_sigterm() -> None:
    """Make SIGTERM end a benchmark like Ctrl-C does: every process it started is stopped on the way out."""
    signal.signal(signal.SIGTERM, _raise_exit)


def command_line(module: str, argv: Sequence[str] | None) -> str:
    """The command that reproduces this run, for the results table."""
    return shlex.join([".venv/bin/python", "-m", module, *(sys.argv[1:] if argv is None else argv)])
