"""The demo's cold start: seconds from launching `smg-node demo` to its first answer.

Cold: a fresh model cache (XDG_CACHE_HOME is a new empty folder, so the demo prepares its model folder) and,
with --no-bytecode, no compiled bytecode of our own packages (a fresh checkout: Python compiles on import).
Warm: the same command again, cache and bytecode in place. The clock starts before the process is spawned and
stops when a chat completion answers 200; the client retries every 20 ms while the port is closed or the
node answers 503.

    python -m bench.cold_start [--runs 3] [--no-bytecode]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
POLL_S = 0.02


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answer(port: int) -> bool:
    body = json.dumps(
        {"model": "llama3", "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 8}
    ).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status == 200 and bool(json.loads(resp.read())["choices"])
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) the process has used: less sensitive than wall time to other
    work on a shared machine."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def first_answer_s(
    cache: Path, *, repo: Path = REPO, timeout_s: float = 120.0, log: Path | None = None
) -> tuple[float, float]:
    """Launch the demo of checkout ``repo`` with ``cache`` as XDG_CACHE_HOME; (seconds until its first chat
    completion answers, CPU seconds the demo used by then)."""
    port = _free_port()
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), "PYTHONPATH": str(repo)}
    out = log.open("wb") if log else subprocess.DEVNULL
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "node.cli", "demo", "--port", str(port)],
        cwd=repo, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        while time.perf_counter() - start < timeout_s:
            if _answer(port):
                return time.perf_counter() - start, _cpu_s(proc.pid)
            if proc.poll() is not None:
                raise RuntimeError(f"the demo exited with {proc.returncode}")
            time.sleep(POLL_S)
        raise TimeoutError(f"no answer within {timeout_s} s")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def _drop_bytecode(repo: Path) -> None:
    for package in ("node", "mesh", "storage"):
        for folder in (repo / package).rglob("__pycache__"):
            shutil.rmtree(folder, ignore_errors=True)


def _summary(label: str, runs: list[tuple[float, float]]) -> str:
    wall = [w for w, _ in runs]
    cpu = [c for _, c in runs]
    return (
        f"{label}: median {statistics.median(wall):.2f} s wall, {statistics.median(cpu):.2f} s CPU"
        f"  (wall {[round(w, 2) for w in wall]}, CPU {[round(c, 2) for c in cpu]})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-bytecode", action="store_true", help="drop our packages' __pycache__ before cold runs")
    parser.add_argument(
        "--compare", type=Path, action="append", default=[], help="another checkout, run alternately with this one"
    )
    args = parser.parse_args()
    repos = [REPO, *args.compare]
    cold: dict[Path, list[tuple[float, float]]] = {r: [] for r in repos}
    warm: dict[Path, list[tuple[float, float]]] = {r: [] for r in repos}
    for _ in range(args.runs):
        for repo in repos:  # alternately, so a change in the machine's load hits every checkout alike
            with tempfile.TemporaryDirectory(prefix="smg-cold-") as tmp:
                if args.no_bytecode:
                    _drop_bytecode(repo)
                cold[repo].append(first_answer_s(Path(tmp), repo=repo))
                warm[repo].append(first_answer_s(Path(tmp), repo=repo))
    for repo in repos:
        print(repo)
        print("  " + _summary("cold (fresh model cache" + (", no bytecode)" if args.no_bytecode else ")"), cold[repo]))
        print("  " + _summary("warm", warm[repo]))
    print(f"load average after: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
