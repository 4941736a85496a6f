"""Network namespaces and nftables for real partitions on one machine (see shared/MESH-NOTES.md).

Drops go in the **input** hook (an output-hook drop makes sendto fail with EPERM, which is not a silent
loss). Why two namespaces rather than one: per-source rules in one namespace cut TCP between two groups
only if every outgoing connection leaves from its member's mesh address (members bind their streams to a
specific bind address, not to a wildcard one), and a TCP fallback probe that slipped through would hide the
partition. With each group in its own namespace, joined by a veth pair, a packet's side is fixed by where
its sender runs, whatever source address it chose.

Everything here runs inside `unshare -rn` (a user namespace makes us root in it, also when unprivileged).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from chaos.cluster import kill_process, start_process

#: Tools a partition needs; each is in a Debian package (util-linux, iproute2, nftables).
TOOLS = ("unshare", "nsenter", "ip", "nft")
#: Bound on each helper command (ip, nft): they answer in milliseconds.
COMMAND_TIMEOUT_S = 10.0

CHAOS_TABLE = """
add table inet chaos
add chain inet chaos inp { type filter hook input priority 0; }
"""


def missing_facility() -> str | None:
    """Why real partitions cannot run here (a tool or kernel facility is missing), or None if they can."""
    absent = [tool for tool in TOOLS if shutil.which(tool) is None]
    if absent:
        return f"missing {', '.join(absent)} (apt-get install -y nftables iproute2 util-linux)"
    probe = "ip link set lo up && nft add table inet probe && unshare -n true"
    try:
        done = subprocess.run(
            ["unshare", "-rn", "sh", "-c", probe], capture_output=True, timeout=COMMAND_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare -rn failed: {exc}"
    if done.returncode != 0:
        return f"unshare -rn with nftables failed here: {done.stderr.decode(errors='replace').strip()}"
    return None


def run(args: Sequence[str], stdin: str | None = None) -> str:
    """Run a helper command; raises RuntimeError with its stderr if it fails."""
    done = subprocess.run(
        list(args), check=False, input=stdin, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


@dataclass(frozen=True, slots=True)
class Netns:
    """A network namespace: ours (pid None) or the one a holder process ``pid`` lives in."""

    pid: int | None = None

    @property
    def prefix(self) -> tuple[str, ...]:
        """Prepend to a command to run it in this namespace."""
        return () if self.pid is None else ("nsenter", f"--net=/proc/{self.pid}/ns/net", "--")

    def ip(self, *args: str) -> str:
        return run([*self.prefix, "ip", *args])

    def nft(self, script: str) -> str:
        """Apply an nft script (one command per line) atomically."""
        return run([*self.prefix, "nft", "-f", "-"], stdin=script)

    def setup_chaos_chain(self) -> None:
        self.ip("link", "set", "lo", "up")
        self.nft(CHAOS_TABLE)

    def drop_from(self, sources: Sequence[str], port: int) -> None:
        """Silently drop mesh traffic (UDP and TCP to or from ``port``) arriving from ``sources``."""
        addrs = ", ".join(sources)
        rules = [
            f"add rule inet chaos inp ip saddr {{ {addrs} }} meta l4proto {{ tcp, udp }} th dport {port} drop",
            f"add rule inet chaos inp ip saddr {{ {addrs} }} meta l4proto {{ tcp, udp }} th sport {port} drop",
        ]
        self.nft("\n".join(rules) + "\n")

    def heal(self) -> None:
        self.nft("flush chain inet chaos inp\n")


class Holder:
    """A process parked in a new network namespace (child of ours), so others can nsenter it."""

    def __init__(self, log: Path) -> None:
        self._proc = start_process(["unshare", "-n", "sleep", "3600"], log)
        self.netns = Netns(self._proc.pid)

    def close(self) -> None:
        kill_process(self._proc)


def veth(
    ours: Netns, theirs: Netns, *, names: tuple[str, str], our_addrs: Sequence[str], their_addrs: Sequence[str]
) -> None:
    """Join two namespaces with a veth pair; each end gets its addresses (/24) and goes up, lo too."""
    assert ours.pid is None and theirs.pid is not None
    ours.ip("link", "add", names[0], "type", "veth", "peer", "name", names[1], "netns", str(theirs.pid))
    for ns, name, addrs in ((ours, names[0], our_addrs), (theirs, names[1], their_addrs)):
        for addr in addrs:
            ns.ip("addr", "add", f"{addr}/24", "dev", name)
        ns.ip("link", "set", name, "up")
