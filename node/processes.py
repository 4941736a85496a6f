"""Several node processes on one host sharing the HTTP port (SO_REUSEPORT): the kernel spreads connections.

The processes are mesh members, so they share the worker registry and health like any peers: with
``--mesh-bind`` process k binds port+k and joins its siblings; without it they form a private mesh on loopback,
encrypted with a key only they have (a request to add a worker reaches whichever process the kernel picks).

Python runs one thread of bytecode at a time per process; N full node processes use N cores. The parent only
supervises: it starts the children (each a complete `smg-node serve` with `--processes 1 --reuse-port`),
restarts one that dies (with backoff), and on SIGTERM/SIGINT forwards the signal and waits for them to drain.
With ``hangup`` it forwards SIGHUP too (each child re-reads its mesh key file) instead of dying of it.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import FrameType

from mesh import Keyring
from node.telemetry.multiproc import forget_process

log = logging.getLogger(__name__)

RESTART_BACKOFF_MIN_S = 0.5
RESTART_BACKOFF_MAX_S = 30.0
# A child that ran this long before dying is treated as healthy: its restart backoff starts over.
STABLE_AFTER_S = 60.0
POLL_S = 0.2


def resolve_processes(requested: int) -> int:
    return requested if requested > 0 else max(1, os.cpu_count() or 1)


def reserve_port(host: str) -> int:
    """A free port for ``--port 0``: every child must bind the same concrete port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind((host, 0))
        return int(s.getsockname()[1])


def reserve_port_range(host: str, count: int, attempts: int = 50) -> int:
    """A base port P with P..P+count-1 free for TCP and UDP on ``host`` (the sibling processes' mesh ports)."""
    for _ in range(attempts):
        base = reserve_port(host)
        if base + count > 65536:
            continue
        if all(_free(host, base + k) for k in range(count)):
            return base
    raise OSError(f"no {count} consecutive free ports on {host}")


def _free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
        with socket.socket(family, kind) as s:
            try:
                s.bind((host, port))
            except OSError:
                return False
    return True


def metrics_dir() -> str:
    """A fresh private directory for the siblings' shared metrics; the caller removes it (``shutil.rmtree``)."""
    return tempfile.mkdtemp(prefix="smg-node-metrics-")


def sibling_keyfile() -> str:
    """A fresh keyring file (mode 0600) for the siblings' private mesh; the caller removes it."""
    fd, path = tempfile.mkstemp(prefix="smg-node-mesh-", suffix=".keys")
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(Keyring([Keyring.generate()]).dump())
    return path


@dataclass
class _Child:
    index: int
    proc: subprocess.Popen[bytes]
    started: float
    backoff_s: float = RESTART_BACKOFF_MIN_S
    restart_at: float | None = None


@dataclass
class ProcessGroup:
    """Supervises ``count`` children running ``argv`` (the same command line, pinned to one process each)."""

    argv: Sequence[str]
    count: int
    grace_s: float
    #: Forward SIGHUP to the children (they reload --mesh-key-file on it).
    hangup: bool = False
    #: The directory the children share their metrics in (``metrics_dir()``; "" = each its own).
    metrics_dir: str = ""
    _children: list[_Child] = field(default_factory=list)
    _stopping: bool = False

    def _spawn(self, index: int) -> subprocess.Popen[bytes]:
        env = {**os.environ, "SMG_NODE_PROCESS_INDEX": str(index), "SMG_NODE_PROCESS_COUNT": str(self.count)}
        if self.metrics_dir:  # prometheus-client reads it when the child imports it: before any metric exists
            env |= {"PROMETHEUS_MULTIPROC_DIR": self.metrics_dir, "SMG_NODE_METRICS_DIR": self.metrics_dir}
        return subprocess.Popen([sys.executable, "-m", "node.cli", *self.argv], env=env)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._stopping = True

    def _on_hangup(self, signum: int, frame: FrameType | None) -> None:
        for child in self._children:
            if child.restart_at is None and child.proc.poll() is None:
                child.proc.send_signal(signal.SIGHUP)

    def run(self) -> int:
        """Run until a signal asks to stop; returns the exit code for the parent process."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        if self.hangup:
            signal.signal(signal.SIGHUP, self._on_hangup)
        now = time.monotonic()
        self._children = [_Child(k, self._spawn(k), now) for k in range(self.count)]
        try:
            while not self._stopping:
                time.sleep(POLL_S)
                self._reap_and_restart()
        finally:
            self._stop_all()
        return 0

    def _reap_and_restart(self) -> None:
        now = time.monotonic()
        for child in self._children:
            if child.restart_at is not None:
                if now >= child.restart_at:
                    child.proc, child.started, child.restart_at = self._spawn(child.index), now, None
                continue
            code = child.proc.poll()
            if code is None:
                continue
            if self.metrics_dir:
                forget_process(self.metrics_dir, child.proc.pid, child.index)
            if now - child.started > STABLE_AFTER_S:
                child.backoff_s = RESTART_BACKOFF_MIN_S
            log.error("node process %d exited with %s; restarting in %.1f s", child.index, code, child.backoff_s)
            child.restart_at = now + child.backoff_s
            child.backoff_s = min(child.backoff_s * 2, RESTART_BACKOFF_MAX_S)

    def _stop_all(self) -> None:
        live = [c.proc for c in self._children if c.restart_at is None and c.proc.poll() is None]
        for proc in live:
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s + 5.0
        for proc in live:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
