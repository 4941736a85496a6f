"""A cluster of real `smg-node serve` processes on loopback addresses, and what each one sees of the mesh.

Every node is its own process group with a parent-death signal (SIGKILL): whatever happens to the test, no
node outlives it. Every wait is bounded and polls; nothing relies on a fixed sleep being long enough.
Observations come from `GET /mesh/members`; a member's state change is placed on the wall clock as
`generated_at - since_change_s`, so detection times do not depend on how often we poll.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, cast, get_args

from mesh.config import MeshConfig
from node.cluster.config import ClusterConfig, mesh_config

REPO = Path(__file__).resolve().parent.parent
SMG_NODE = (sys.executable, "-m", "node.cli")

ProfileName = Literal["lan", "wan", "local"]
State = Literal["alive", "suspect", "dead", "left"]

#: How long one GET /mesh/members may take before the node counts as unreachable for that poll.
HTTP_TIMEOUT_S = 2.0
#: Poll period while waiting for a state: short against detection times of ~1 s, cheap for 5 nodes.
POLL_INTERVAL_S = 0.05
#: A node process (imports, tokenizer, worker connection) starts in ~2 s idle; 5 at once on 2 cores take longer.
START_TIMEOUT_S = 60.0
#: SIGTERM → graceful leave (bounded by the mesh's leave timeout) → exit.
EXIT_TIMEOUT_S = 20.0

MESH_METRIC_PREFIX = "smg_node_mesh_"

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: SIGKILL this child when the process that started it dies (even by SIGKILL)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass(frozen=True, slots=True)
class Profile:
    """A mesh timing profile as the CLI selects it: --mesh-profile NAME [--mesh-probe-interval-s S]."""

    name: ProfileName
    probe_interval_s: float = 0.0  # 0: the profile's own

    @property
    def label(self) -> str:
        return self.name + (f" with {self.probe_interval_s * 1000:.0f} ms probes" if self.probe_interval_s else "")

    def args(self) -> list[str]:
        out = ["--mesh-profile", self.name]
        if self.probe_interval_s:
            out += ["--mesh-probe-interval-s", str(self.probe_interval_s)]
        return out

    def config(self) -> MeshConfig:
        """The MeshConfig a node builds from these flags; raises ValueError if the node would refuse them."""
        cluster = ClusterConfig(
            mesh_bind="127.0.0.1:7946", mesh_profile=self.name, mesh_probe_interval_s=self.probe_interval_s
        )
        return mesh_config(cluster)

    def suspicion_min_s(self, members: int) -> float:
        """Lifeguard's shortest suspicion: mult x max(1, log10 n) x probe interval (mesh/README.md)."""
        config = self.config()
        return config.suspicion_mult * max(1.0, math.log10(members)) * config.probe_interval_s


#: The default suite's profile: lan with 200 ms probes (the node caps the probe timeout at half the interval).
FAST_PROFILE = Profile("lan", 0.2)
LAN_PROFILE = Profile("lan")


@dataclass(frozen=True, slots=True)
class MemberView:
    """One member as one node sees it."""

    name: str
    state: State
    incarnation: int
    mesh_addr: str
    http_addr: str
    changed_at: float  # wall clock (time.time()) of the last state change, as the observer reports it

    @classmethod
    def from_json(cls, raw: dict[str, object], generated_at: float) -> MemberView:
        since = raw["since_change_s"]
        incarnation = raw["incarnation"]
        assert isinstance(since, int | float) and isinstance(incarnation, int)
        state = str(raw["state"])
        assert state in get_args(State), state
        return cls(
            name=str(raw["name"]),
            state=cast(State, state),
            incarnation=incarnation,
            mesh_addr=str(raw["mesh_addr"]),
            http_addr=str(raw["http_addr"]),
            changed_at=generated_at - float(since),
        )


View = dict[str, MemberView]


def _open(url: str, timeout_s: float, api_key: str) -> urllib.request.Request | str:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return urllib.request.Request(url, headers=headers) if headers else url


def fetch_view(url: str, timeout_s: float = HTTP_TIMEOUT_S, api_key: str = "") -> View | None:
    """The members a node lists at ``url`` (asked with ``api_key`` if the cluster needs one), or None if it
    does not answer in time."""
    try:
        with urllib.request.urlopen(
            _open(url.rstrip("/") + "/mesh/members", timeout_s, api_key), timeout=timeout_s
        ) as resp:
            body = json.loads(resp.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None
    generated_at = float(body["generated_at"])
    return {m["name"]: MemberView.from_json(m, generated_at) for m in body["members"]}


def fetch_mesh_metrics(url: str, timeout_s: float = HTTP_TIMEOUT_S, api_key: str = "") -> dict[str, float] | None:
    """The node's unlabelled mesh counters from GET /metrics (``smg_node_mesh_deaths_total`` → ``deaths``),
    or None if it does not answer in time."""
    try:
        with urllib.request.urlopen(_open(url.rstrip("/") + "/metrics", timeout_s, api_key), timeout=timeout_s) as resp:
            text = resp.read().decode()
    except (urllib.error.URLError, OSError, ValueError):
        return None
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(MESH_METRIC_PREFIX) and "{" not in line:
            name, _, value = line.partition(" ")
            out[name.removeprefix(MESH_METRIC_PREFIX).removesuffix("_total")] = float(value)
    return out


def alive_names(view: View) -> set[str]:
    return {name for name, m in view.items() if m.state == "alive"}


@dataclass(slots=True)
class Node:
    name: str
    mesh_host: str
    mesh_port: int
    http_host: str
    http_port: int
    join: tuple[str, ...] = ()
    key_file: Path | None = None
    tls: tuple[Path, Path, Path] | None = None  # certificate, key, CA: --mesh-tls-cert/-key/-ca
    prefix: tuple[str, ...] = ()  # e.g. nsenter --net=... to start it in another network namespace
    extra: tuple[str, ...] = ()  # more `serve` flags, e.g. ("--health-interval-s", "0.5")
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    logs: list[Path] = field(default_factory=list)

    @property
    def mesh_addr(self) -> str:
        return f"{self.mesh_host}:{self.mesh_port}"

    @property
    def url(self) -> str:
        return f"http://{self.http_host}:{self.http_port}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def argv(self, model_dir: Path, worker_url: str, profile: Profile) -> list[str]:
        args = [*self.prefix, *SMG_NODE, "serve", "--processes", "1", "--host", self.http_host]
        args += ["--port", str(self.http_port), "--model-path", str(model_dir), "--worker", worker_url]
        args += ["--mesh-bind", self.mesh_addr, "--node-name", self.name, *profile.args()]
        args += self.extra
        for peer in self.join:
            args += ["--join", peer]
        if self.key_file is not None:
            args += ["--mesh-key-file", str(self.key_file)]
        if self.tls is not None:
            cert, key, ca = self.tls
            args += ["--mesh-tls-cert", str(cert), "--mesh-tls-key", str(key), "--mesh-tls-ca", str(ca)]
        return args


def start_process(args: Sequence[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start ``args`` in its own process group, output to ``log``, SIGKILLed if we die."""
    with log.open("ab") as out:
        return subprocess.Popen(
            list(args),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=REPO,
            start_new_session=True,
            # Only prctl(2) runs between fork and exec: safe with threads in this process.
            preexec_fn=_die_with_parent,  # noqa: PLW1509
            env={**os.environ, **(env or {})},
        )


def kill_process(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL ``proc``'s process group and reap it (bounded)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def free_port(hosts: Sequence[str], attempts: int = 50) -> int:
    """A port free for both TCP and UDP on every one of ``hosts`` (mesh members bind both on one port)."""
    import socket

    for _ in range(attempts):
        with socket.socket() as probe:
            probe.bind((hosts[0], 0))
            port = int(probe.getsockname()[1])
        try:
            with contextlib.ExitStack() as stack:
                for host in hosts:
                    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
                        sock = stack.enter_context(socket.socket(socket.AF_INET, kind))
                        sock.bind((host, port))
        except OSError:
            continue
        return port
    raise RuntimeError(f"no port free on all of {list(hosts)}")


def wait_until(check: Callable[[], bool], *, timeout_s: float, what: str, interval_s: float = POLL_INTERVAL_S) -> float:
    """Poll ``check`` until true; return the seconds it took. Raises TimeoutError naming ``what``."""
    started = time.monotonic()
    deadline = started + timeout_s
    while True:
        if check():
            return time.monotonic() - started
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)


class Cluster:
    """Real node processes sharing one worker; a context manager that kills every node on exit."""

    def __init__(self, *, workdir: Path, model_dir: Path, worker_url: str, profile: Profile, api_key: str = "") -> None:
        """``api_key``: the key our observations are made with, when the nodes require one."""
        self.workdir = workdir
        self.api_key = api_key
        self.model_dir = model_dir
        self.worker_url = worker_url
        self.profile = profile
        self.nodes: dict[str, Node] = {}

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for node in self.nodes.values():
            if node.proc is not None:
                kill_process(node.proc)

    # -- membership of the test's own bookkeeping --

    def add(self, node: Node) -> Node:
        if node.name in self.nodes:
            raise ValueError(f"node {node.name} already added")
        self.nodes[node.name] = node
        return node

    def __getitem__(self, name: str) -> Node:
        return self.nodes[name]

    def running(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.running]

    # -- process control --

    def start(self, *nodes: Node) -> None:
        for node in nodes:
            if node.running:
                raise RuntimeError(f"{node.name} is already running")
            node.starts += 1
            log = self.workdir / f"{node.name}.{node.starts}.log"
            node.logs.append(log)
            node.proc = start_process(node.argv(self.model_dir, self.worker_url, self.profile), log)

    def wait_up(self, *nodes: Node, timeout_s: float = START_TIMEOUT_S) -> None:
        """Wait until each node answers GET /mesh/members; raises RuntimeError with its log if one exits."""

        def up() -> bool:
            for node in nodes:
                if node.proc is not None and node.proc.poll() is not None:
                    raise RuntimeError(f"{node.name} exited with {node.proc.returncode}:\n{self.tail(node)}")
            return all(fetch_view(n.url, api_key=self.api_key) is not None for n in nodes)

        wait_until(up, timeout_s=timeout_s, what="nodes to serve /mesh/members", interval_s=0.2)

    def kill(self, node: Node) -> float:
        """kill -9; returns the wall time of the kill."""
        assert node.proc is not None
        at = time.time()
        os.kill(node.proc.pid, signal.SIGKILL)
        node.proc.wait(timeout=10)
        return at

    def stop(self, node: Node) -> None:
        assert node.proc is not None
        os.kill(node.proc.pid, signal.SIGSTOP)

    def cont(self, node: Node) -> None:
        assert node.proc is not None
        os.kill(node.proc.pid, signal.SIGCONT)

    def terminate(self, node: Node, timeout_s: float = EXIT_TIMEOUT_S) -> int:
        """SIGTERM and wait for the exit; returns the exit code. Raises subprocess.TimeoutExpired."""
        assert node.proc is not None
        node.proc.send_signal(signal.SIGTERM)
        return node.proc.wait(timeout=timeout_s)

    def tail(self, node: Node, lines: int = 30) -> str:
        if not node.logs:
            return "(never started)"
        text = node.logs[-1].read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    # -- observation --

    def views(self, observers: Iterable[Node]) -> dict[str, View | None]:
        return {n.name: fetch_view(n.url, api_key=self.api_key) for n in observers}

    def counters(self, observers: Iterable[Node], name: str) -> dict[str, float]:
        """One mesh counter (e.g. ``deaths``) of each observer; raises RuntimeError if one does not answer."""
        out: dict[str, float] = {}
        for node in observers:
            metrics = fetch_mesh_metrics(node.url, api_key=self.api_key)
            if metrics is None:
                raise RuntimeError(f"{node.name} did not serve /metrics")
            out[node.name] = metrics[name]
        return out

    def converged(self, observers: Sequence[Node], members: Iterable[str]) -> bool:
        """Every observer lists exactly ``members`` as alive (others may be listed dead or left)."""
        expected = set(members)
        return all(view is not None and alive_names(view) == expected for view in self.views(observers).values())

    def wait_converged(
        self, observers: Sequence[Node] | None = None, members: Iterable[str] | None = None, timeout_s: float = 30.0
    ) -> float:
        """Wait until every running node (or ``observers``) lists the running nodes (or ``members``) alive."""
        obs = list(observers) if observers is not None else self.running()
        names = set(members) if members is not None else {n.name for n in obs}
        try:
            return wait_until(lambda: self.converged(obs, names), timeout_s=timeout_s, what="convergence")
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}: want {sorted(names)} alive; saw {self.describe(obs)}") from None

    def wait_state(
        self, observers: Sequence[Node], subject: str, states: Iterable[State], timeout_s: float
    ) -> dict[str, MemberView]:
        """Wait until every observer lists ``subject`` in one of ``states`` (or no longer lists it, if 'dead'
        or 'left' are among them and it was reaped). Returns each observer's first matching view of it."""
        wanted = set(states)
        seen: dict[str, MemberView] = {}
        deadline = time.monotonic() + timeout_s
        while len(seen) < len(observers):
            for node in observers:
                if node.name in seen:
                    continue
                view = fetch_view(node.url)
                member = None if view is None else view.get(subject)
                if member is not None and member.state in wanted:
                    seen[node.name] = member
            if len(seen) == len(observers):
                break
            if time.monotonic() >= deadline:
                missing = [n for n in observers if n.name not in seen]
                raise TimeoutError(
                    f"timed out after {timeout_s:.0f} s waiting for {subject} to be {sorted(wanted)}; "
                    f"still not: {self.describe(missing)}"
                )
            time.sleep(POLL_INTERVAL_S)
        return seen

    def watch(self, observers: Sequence[Node], duration_s: float, forbidden: Iterable[State]) -> list[str]:
        """Poll for ``duration_s``; return every (observer, member, state) seen in a ``forbidden`` state."""
        bad = set(forbidden)
        found: list[str] = []
        deadline = time.monotonic() + duration_s
        while time.monotonic() < deadline:
            for name, view in self.views(observers).items():
                for member in (view or {}).values():
                    entry = f"{name} saw {member.name} {member.state} (inc {member.incarnation})"
                    if member.state in bad and entry not in found:
                        found.append(entry)
            time.sleep(POLL_INTERVAL_S)
        return found

    def listed(self, observers: Sequence[Node], duration_s: float) -> dict[str, set[str]]:
        """Poll for ``duration_s``; return every member name each observer listed at least once (any state)."""
        names: dict[str, set[str]] = {n.name: set() for n in observers}
        deadline = time.monotonic() + duration_s
        while time.monotonic() < deadline:
            for name, view in self.views(observers).items():
                names[name].update(view or {})
            time.sleep(POLL_INTERVAL_S)
        return names

    def describe(self, observers: Iterable[Node]) -> str:
        parts = []
        for name, view in self.views(observers).items():
            if view is None:
                parts.append(f"{name}: no answer")
            else:
                states = ", ".join(f"{m.name}={m.state}/{m.incarnation}" for m in view.values())
                parts.append(f"{name}: {states}")
        return "; ".join(parts)


@contextlib.contextmanager
def sim_worker(model_dir: Path, log: Path, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """One simulated worker for all nodes; yields its grpc:// URL."""
    from tests.procs import port_open

    port = port or free_port([host])
    proc = start_process(
        [*SMG_NODE, "sim-worker", "--host", host, "--port", str(port), "--model-path", str(model_dir)], log
    )
    try:
        wait_until(lambda: port_open(port, host), timeout_s=START_TIMEOUT_S, what="the sim worker", interval_s=0.1)
        yield f"grpc://{host}:{port}"
    finally:
        kill_process(proc)


def loopback_nodes(count: int, *, mesh_port: int, first_host: int = 1, name_prefix: str = "n") -> list[Node]:
    """``count`` nodes on 127.0.0.<first_host>.. sharing ``mesh_port``; all but the first join the first."""
    hosts = [f"127.0.0.{first_host + k}" for k in range(count)]
    seed = f"{hosts[0]}:{mesh_port}"
    return [
        Node(
            name=f"{name_prefix}{k + 1}",
            mesh_host=host,
            mesh_port=mesh_port,
            http_host="127.0.0.1",
            http_port=free_port(["127.0.0.1"]),
            join=() if k == 0 else (seed,),
        )
        for k, host in enumerate(hosts)
    ]
