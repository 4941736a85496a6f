"""A private Docker daemon for the docker test tier: started from a temporary folder, stopped by PID, and
everything it made on the host removed afterwards, also when a test fails.

dockerd with bridge networking adds iptables chains and rules, the docker0 bridge (and one bridge per compose
network, with veth pairs), and mounts under its data and exec roots. Those names are shared by every bridge-mode
daemon on the machine, so runs are serialised with a lock, and cleanup removes exactly what appeared since
start (a diff of iptables-save and of the link list), never rules or links that were there before.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

LOCK_FILE = Path(tempfile.gettempdir()) / "smg-node-docker-tier.lock"
# Another run holding the lock gets this long to finish before we give up (a whole tier takes well under it).
LOCK_WAIT_S = 1800.0
# dockerd answers within ~1 s here; a loaded machine gets some slack.
START_TIMEOUT_S = 60.0
# On SIGTERM dockerd stops its containers (each gets its own stop timeout) before exiting.
STOP_TIMEOUT_S = 60.0
PACKAGES = ("docker.io", "docker-compose", "debootstrap", "iptables")
_TABLES = ("filter", "nat")


class DockerUnavailable(Exception):
    """This machine cannot run the tier (not root, no apt to install Docker, no dockerd)."""


@dataclass(frozen=True)
class Daemon:
    host: str  # DOCKER_HOST
    root: Path

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "DOCKER_HOST": self.host}


def ensure_packages() -> None:
    """Install Docker, docker-compose, debootstrap and iptables from Debian's packages if missing.
    Raises DockerUnavailable when that is impossible here."""
    missing = [cmd for cmd in ("dockerd", "docker-compose", "debootstrap", "iptables") if shutil.which(cmd) is None]
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise DockerUnavailable(f"missing {', '.join(missing)} and cannot install them (needs root and apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, timeout=600, capture_output=True)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES],
        check=True,
        env=env,
        timeout=900,
        capture_output=True,
    )


@contextlib.contextmanager
def exclusive(timeout_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """Hold the machine-wide lock of bridge-mode daemons (waiting up to ``timeout_s``)."""
    with LOCK_FILE.open("a") as lock:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{LOCK_FILE} held by another docker tier for {timeout_s:.0f} s") from None
                time.sleep(1)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _iptables_rules(table: str) -> list[str]:
    out = subprocess.run(["iptables-save", "-t", table], check=True, capture_output=True, text=True, timeout=30)
    return [line for line in out.stdout.splitlines() if line.startswith((":", "-A "))]


def _links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], check=True, capture_output=True, text=True, timeout=30)
    return {line.split(":")[1].strip().split("@")[0] for line in out.stdout.splitlines() if ":" in line}


def _pids_mentioning(text: str) -> list[int]:
    """Processes whose command line names ``text`` (our private folder): dockerd, its containerd and shims."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            pids.append(int(entry.name))
    return pids


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not Path(f"/proc/{pid}").exists():
            return True
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.1)
    return False


def _stop(proc: subprocess.Popen[bytes], root: Path) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    for pid in _pids_mentioning(str(root)):  # containerd and shims outlive a killed dockerd
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        _wait_gone(pid, 10)


def _unmount_under(root: Path) -> None:
    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    for point in sorted((m for m in mounts if m.startswith(str(root))), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True, timeout=30)


def _remove_iptables(table: str, before: list[str]) -> None:
    """Delete the rules and then the chains that appeared in ``table`` since ``before``."""
    old = set(before)
    added = [line for line in _iptables_rules(table) if line not in old]
    for rule in (line for line in added if line.startswith("-A ")):
        spec = rule[3:].split()
        subprocess.run(["iptables", "-t", table, "-D", *spec], check=False, capture_output=True, timeout=30)
    chains = [line[1:].split()[0] for line in added if line.startswith(":")]
    for chain in chains:
        subprocess.run(["iptables", "-t", table, "-F", chain], check=False, capture_output=True, timeout=30)
    for chain in chains:
        subprocess.run(["iptables", "-t", table, "-X", chain], check=False, capture_output=True, timeout=30)


@contextlib.contextmanager
def private_dockerd() -> Iterator[Daemon]:
    """Start a dockerd of our own (bridge networking, state in a temporary folder); yield it; then stop it
    and remove everything it made. Raises DockerUnavailable if it cannot run here."""
    if os.geteuid() != 0:
        raise DockerUnavailable("the docker tier runs a private dockerd, which needs root")
    ensure_packages()
    with exclusive():
        rules_before = {table: _iptables_rules(table) for table in _TABLES}
        links_before = _links()
        root = Path(tempfile.mkdtemp(prefix="smg-dockerd-"))
        sock = root / "docker.sock"
        log = (root / "dockerd.log").open("wb")
        proc = subprocess.Popen(
            [
                "dockerd",
                f"--data-root={root / 'data'}",
                f"--exec-root={root / 'exec'}",
                f"--pidfile={root / 'dockerd.pid'}",
                f"--host=unix://{sock}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            daemon = Daemon(host=f"unix://{sock}", root=root)
            deadline = time.monotonic() + START_TIMEOUT_S
            while subprocess.run(
                ["docker", "info"], check=False, env=daemon.env, capture_output=True, timeout=30
            ).returncode:
                if proc.poll() is not None or time.monotonic() > deadline:
                    tail = (root / "dockerd.log").read_text(errors="replace")[-2000:]
                    raise DockerUnavailable(f"dockerd did not start:\n{tail}")
                time.sleep(0.3)
            yield daemon
        finally:
            _stop(proc, root)
            log.close()
            _unmount_under(root)
            for table in _TABLES:
                _remove_iptables(table, rules_before[table])
            for link in sorted(_links() - links_before):
                subprocess.run(["ip", "link", "delete", link], check=False, capture_output=True, timeout=30)
            shutil.rmtree(root, ignore_errors=True)
