"""Several node processes on one host sharing the HTTP port (SO_REUSEPORT): the kernel spreads connections.

The processes are mesh members, so they share the worker registry and health like any peers: with
``--mesh-bind`` process k binds port+k and joins its siblings; without it they form a private mesh on loopback,
encrypted with a key only they have (a request to add a worker reaches whichever process the kernel picks).

Python runs one thread of bytecode at a time per process; N full node processes use N cores. The parent only
supervises: it starts the children (each a complete `smg-node serve` with `--processes 1 --reuse-port`),
restarts one that dies (with backoff), and on SIGTERM/SIGINT forwards the signal and waits for them to drain.
With ``hangup`` it forwards SIGHUP too (each child re-reads its mesh key file) instead of dying of it.

Children die with their supervisor, however it ends (kill -9 included): unsupervised children would keep the
port and serve on, never restarted. Each child, first thing, asks the kernel for SIGTERM when its parent dies
(Linux PR_SET_PDEATHSIG) and then checks that its parent is still the supervisor that started it (one that
died before the request was made would never signal). Without prctl the child watches a pipe whose only write
end the supervisor holds: end of file means the supervisor is gone. Either way the child drains as on SIGTERM.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
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
PR_SET_PDEATHSIG = 1  # linux/prctl.h
#: The signal a child gets when its supervisor dies: the one that drains it, as a supervisor's stop does.
SUPERVISOR_DEATH_SIGNAL = signal.SIGTERM


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


def follow_supervisor(supervisor_pid: int, pipe_fd: int) -> str:
    """In a child, first thing: end this process (SIGTERM) when ``supervisor_pid`` dies; returns how.

    ``pipe_fd`` is the read end of a pipe whose write end only the supervisor holds: watched (a daemon thread
    blocked on it) where PR_SET_PDEATHSIG is not available, closed where it is.
    """
    if _set_parent_death_signal(SUPERVISOR_DEATH_SIGNAL):
        os.close(pipe_fd)
        mechanism = "prctl"
    else:
        threading.Thread(target=_signal_on_eof, args=(pipe_fd,), name="supervisor-watch", daemon=True).start()
        mechanism = "pipe"
    if os.getppid() != supervisor_pid:  # it died before the kernel (or the pipe) could tell us
        os.kill(os.getpid(), SUPERVISOR_DEATH_SIGNAL)
    return mechanism


def _set_parent_death_signal(sig: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return False
    return int(prctl(PR_SET_PDEATHSIG, sig)) == 0


def _signal_on_eof(fd: int) -> None:
    with contextlib.suppress(OSError):
        while os.read(fd, 1):
            pass
    os.kill(os.getpid(), SUPERVISOR_DEATH_SIGNAL)


@dataclass
class _Child:
    index: int
    proc: subprocess.Popen[bytes]
    started: float
    backoff_s: float = RESTART_BACKOFF_MIN_S
    restart_at: float | None = None
    #: The write end of the child's supervisor pipe (see `follow_supervisor`), held until the child is reaped.
    pipe: int | None = None


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

    def _spawn(self, index: int) -> tuple[subprocess.Popen[bytes], int]:
        """Start child ``index``; returns it and the write end of its supervisor pipe."""
        env = {**os.environ, "SMG_NODE_PROCESS_INDEX": str(index), "SMG_NODE_PROCESS_COUNT": str(self.count)}
        if self.metrics_dir:  # prometheus-client reads it when the child imports it: before any metric exists
            env |= {"PROMETHEUS_MULTIPROC_DIR": self.metrics_dir, "SMG_NODE_METRICS_DIR": self.metrics_dir}
        watched, held = os.pipe()
        follow = ["--supervisor-pid", str(os.getpid()), "--supervisor-fd", str(watched)]
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "node.cli", *self.argv, *follow], env=env, pass_fds=(watched,)
            )
        except BaseException:
            os.close(held)
            raise
        finally:
            os.close(watched)
        return proc, held

    def _start(self, child: _Child, now: float) -> None:
        if child.pipe is not None:
            os.close(child.pipe)
        child.proc, child.pipe = self._spawn(child.index)
        child.started, child.restart_at = now, None

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
        for k in range(self.count):
            proc, pipe = self._spawn(k)
            self._children.append(_Child(k, proc, now, pipe=pipe))
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
                    self._start(child, now)
                continue
            code = child.proc.poll()
            if code is None:
                continue
            if self.metrics_dir:
                forget_process(self.metrics_dir, child.proc.pid, child.index)
            if now - child.started > STABLE_AFTER_S:
                child.backoff_s = RESTART_BACKOFF_MIN_S
            if code == 0:
                # A drained, clean exit: the child was told to stop, most often by the same signal that is
                # stopping this supervisor (a signal to the whole process group: Ctrl-C, systemd), which then
                # ends the loop before the restart is due.
                log.info(
                    "node process %d stopped; restarting in %.1f s unless the node stops", child.index, child.backoff_s
                )
            else:
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
        for child in self._children:
            if child.pipe is not None:
                os.close(child.pipe)
                child.pipe = None
