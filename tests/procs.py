"""Real processes for tests: own process group, bounded waits, always killed."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

SMG_NODE = [sys.executable, "-m", "node.cli"]
REPO = Path(__file__).resolve().parent.parent


# Ports free_port handed out in this process (at most the 65,536 there are).
_handed_out: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now and never handed out before by this process: bind(0) may return the same port twice in a
    row, and two services of one test given the same port collide (CI saw a node's HTTP port handed out again as
    its peer's mesh port)."""
    while True:
        with socket.socket() as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def wait_until(check: Callable[[], bool], *, timeout_s: float, what: str, interval_s: float = 0.05) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(interval_s)
    raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")


def http_status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, OSError):
        return None


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


@contextlib.contextmanager
def process(args: Sequence[str], *, log: Path, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``args``, output to ``log``; on exit SIGKILL its whole process group (bounded, no leftovers)."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            list(args),
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
        try:
            yield proc
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
