"""The demo's cold start: seconds from launching `smg-node demo` to its first answer.

The command is the README's: the `smg-node` console script of the venv running this script (`--venv` names
another), with PYTHONPATH set to the checkout so `--compare` checkouts can share one venv.
Cold: a fresh model cache (XDG_CACHE_HOME is a new empty folder, so the demo prepares its model folder) and,
with --no-bytecode, no compiled bytecode of our own packages (a fresh clone installed with `pip install -e`
without the README's compile step: Python compiles on import); with --compile, the bytecode the README's
install step writes (`python -m compileall -q node mesh storage`, timed apart: it is install time). Warm: the
same command again, cache and bytecode in place. The clock starts before the process is spawned and stops
when a chat completion answers 200; the client retries every 20 ms while the port is closed or the node
answers 503.

    python -m bench.cold_start [--runs 3] [--no-bytecode | --compile] [--venv DIR] [--compare CHECKOUT ...]
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
    cache: Path,
    *,
    repo: Path = REPO,
    venv: Path = Path(sys.prefix),
    timeout_s: float = 120.0,
    log: Path | None = None,
) -> tuple[float, float]:
    """Launch the demo of checkout ``repo`` with ``cache`` as XDG_CACHE_HOME; (seconds until its first chat
    completion answers, CPU seconds the demo used by then)."""
    port = _free_port()
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), "PYTHONPATH": str(repo)}
    # As in a user's shell: the first launch writes bytecode for the next ones (CI-like environments, ours
    # included, often set PYTHONDONTWRITEBYTECODE, which would make every launch a no-bytecode launch).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    out = log.open("wb") if log else subprocess.DEVNULL
    start = time.perf_counter()
    proc = subprocess.Popen(
        [str(venv / "bin" / "smg-node"), "demo", "--port", str(port)],
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


PACKAGES = ("node", "mesh", "storage")


def _drop_bytecode(repo: Path) -> None:
    for package in PACKAGES:
        for folder in (repo / package).rglob("__pycache__"):
            shutil.rmtree(folder, ignore_errors=True)


def _compile(repo: Path, venv: Path) -> float:
    """The README's install step on a checkout without bytecode; its wall seconds."""
    _drop_bytecode(repo)
    start = time.perf_counter()
    subprocess.run([str(venv / "bin" / "python"), "-m", "compileall", "-q", *PACKAGES], cwd=repo, check=True)
    return time.perf_counter() - start


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
    bytecode = parser.add_mutually_exclusive_group()
    bytecode.add_argument("--no-bytecode", action="store_true", help="drop our packages' __pycache__ before cold runs")
    bytecode.add_argument(
        "--compile", action="store_true", help="compile as the README's install step before cold runs"
    )
    parser.add_argument("--venv", type=Path, default=Path(sys.prefix), help="the venv whose smg-node to run")
    parser.add_argument(
        "--compare", type=Path, action="append", default=[], help="another checkout, run alternately with this one"
    )
    args = parser.parse_args()
    repos = [REPO, *args.compare]
    cold: dict[Path, list[tuple[float, float]]] = {r: [] for r in repos}
    warm: dict[Path, list[tuple[float, float]]] = {r: [] for r in repos}
    compile_s: dict[Path, list[float]] = {r: [] for r in repos}
    for _ in range(args.runs):
        for repo in repos:  # alternately, so a change in the machine's load hits every checkout alike
            with tempfile.TemporaryDirectory(prefix="smg-cold-") as tmp:
                if args.no_bytecode:
                    _drop_bytecode(repo)
                elif args.compile:
                    compile_s[repo].append(_compile(repo, args.venv))
                cold[repo].append(first_answer_s(Path(tmp), repo=repo, venv=args.venv))
                warm[repo].append(first_answer_s(Path(tmp), repo=repo, venv=args.venv))
    label = "cold (fresh model cache" + (
        ", no bytecode)" if args.no_bytecode else ", compiled at install)" if args.compile else ")"
    )
    for repo in repos:
        print(repo)
        if compile_s[repo]:
            print(f"  install step (compileall): median {statistics.median(compile_s[repo]):.2f} s wall")
        print("  " + _summary(label, cold[repo]))
        print("  " + _summary("warm", warm[repo]))
    print(f"load average after: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
