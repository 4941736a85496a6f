"""The compose cluster of deploy/compose under a private dockerd: build the images from the working tree, bring
it up, and the probes the docker tier needs (containers, their addresses, the mesh as a node sees it, load)."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.deploy.dockerd import Daemon
from tests.procs import REPO, free_port

COMPOSE_DIR = REPO / "deploy" / "compose"
BASE_IMAGE = "local/debian:bookworm"
# The debootstrapped root file system, kept between runs: the slowest step of a cold build (~25 s to minutes).
BASE_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "smg-node" / "debian-bookworm.tar"
BUILD_TIMEOUT_S = 1800.0
COMPOSE_TIMEOUT_S = 300.0
MODEL = "llama3"


def _post(url: str, body: dict[str, object], timeout_s: float = 30) -> dict[str, object]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        result: dict[str, object] = json.loads(resp.read())
        return result


def get_json(url: str, timeout_s: float = 5) -> dict[str, object]:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        result: dict[str, object] = json.loads(resp.read())
        return result


def status(url: str, timeout_s: float = 5) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, OSError):
        return None


def chat(url: str, max_tokens: int = 8) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens}
    result = _post(url + "/v1/chat/completions", body)
    assert result["choices"], result


def stream(url: str, max_tokens: int) -> int:
    """A streamed chat completion to its end; returns the tokens it carried (its usage chunk's count: deltas
    carry as many tokens as reached the node together). Raises on any failure or a cut."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me a long story"}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    req = urllib.request.Request(
        url + "/v1/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    chunks, tokens, done = 0, 0, False
    with urllib.request.urlopen(req, timeout=120) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                event = json.loads(line[6:])
                if "error" in event:
                    raise RuntimeError(f"stream error: {event['error']}")
                chunks += 1
                if event.get("usage"):
                    tokens = event["usage"]["completion_tokens"]
    if not done:
        raise RuntimeError(f"stream cut after {chunks} chunks")
    return tokens


def store_response(url: str) -> str:
    result = _post(url + "/v1/responses", {"model": MODEL, "input": "remember me", "max_output_tokens": 4})
    return str(result["id"])


@dataclass
class Load:
    """Steady traffic through the entry point from a few threads; every failure is kept with its reason."""

    url: str
    threads: int = 4
    stream_every: int = 0  # every Nth request of a thread is a stream (0: none)
    ok: int = 0
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _workers: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            try:
                if self.stream_every and n % self.stream_every == 0:
                    stream(self.url, 64)
                else:
                    chat(self.url)
                with self._lock:
                    self.ok += 1
            except Exception as exc:
                with self._lock:
                    self.failures.append(f"{time.strftime('%H:%M:%S')} {exc!r}")

    def __enter__(self) -> Load:
        self._workers = [threading.Thread(target=self._run, daemon=True) for _ in range(self.threads)]
        for worker in self._workers:
            worker.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for worker in self._workers:
            worker.join(150)


@dataclass
class Cluster:
    daemon: Daemon
    project: str
    port: int
    timings: dict[str, float] = field(default_factory=dict)
    extra_env: dict[str, str] = field(default_factory=dict)  # compose variables a test sets (SMG_POLICY, ...)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        return {
            **self.daemon.env,
            "SMG_BASE_IMAGE": BASE_IMAGE,
            "BASE_IMAGE": BASE_IMAGE,  # deploy/docker/build.sh
            "SMG_DEBIAN_IMAGE": BASE_IMAGE,
            "SMG_PORT": str(self.port),
            "SMG_LB_STATS_PORT": str(free_port()),
            **self.extra_env,
        }

    def run(
        self,
        args: Sequence[str],
        timeout_s: float = COMPOSE_TIMEOUT_S,
        cwd: Path = REPO,
        env: Mapping[str, str] | None = None,
    ) -> str:
        result = subprocess.run(
            list(args),
            cwd=cwd,
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        if result.returncode:
            raise RuntimeError(f"{' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
        return result.stdout

    def compose(self, *args: str, timeout_s: float = COMPOSE_TIMEOUT_S) -> str:
        return self.run(["docker-compose", "-p", self.project, *args], timeout_s, cwd=COMPOSE_DIR)

    def build(self) -> None:
        started = time.monotonic()
        env_cache = {"SMG_BASE_CACHE": str(BASE_CACHE)}
        subprocess.run(
            ["bash", "deploy/docker/build-base.sh", BASE_IMAGE],
            cwd=REPO,
            env={**self.env, **env_cache},
            check=True,
            capture_output=True,
            timeout=BUILD_TIMEOUT_S,
        )
        self.timings["base image"] = time.monotonic() - started
        started = time.monotonic()
        self.run(["bash", "deploy/docker/build.sh", "smg-node:local"], BUILD_TIMEOUT_S)
        self.timings["smg-node image"] = time.monotonic() - started
        started = time.monotonic()
        self.compose("build", "lb", "redis", timeout_s=BUILD_TIMEOUT_S)
        self.timings["lb and redis images"] = time.monotonic() - started
        size = self.run(["docker", "image", "inspect", "-f", "{{.Size}}", "smg-node:local"]).strip()
        self.timings["smg-node image MB"] = int(size) / 1e6

    def containers(self, service: str) -> list[str]:
        out = self.run(
            [
                "docker",
                "ps",
                "-a",
                "--filter",
                f"label=com.docker.compose.project={self.project}",
                "--filter",
                f"label=com.docker.compose.service={service}",
                "--format",
                "{{.Names}}",
            ]
        )
        return sorted(out.split())

    def ip(self, container: str) -> str:
        fmt = "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}"
        return self.run(["docker", "inspect", "-f", fmt, container]).strip()

    def node_url(self, container: str) -> str:
        return f"http://{self.ip(container)}:8000"

    def health(self, container: str) -> str:
        return self.run(["docker", "inspect", "-f", "{{.State.Health.Status}}", container]).strip()

    def alive_members(self, container: str) -> set[str]:
        """Mesh addresses of the members ``container``'s node sees alive (empty if it does not answer)."""
        ip = self.ip(container)
        if not ip:
            return set()
        try:
            members = get_json(f"http://{ip}:8000/mesh/members")["members"]
        except (OSError, ValueError):
            return set()
        assert isinstance(members, list)
        return {str(m["mesh_addr"]) for m in members if m["state"] == "alive"}

    def meshed(self) -> bool:
        """Every node is healthy, ready, and sees every node alive."""
        nodes = self.containers("node")
        addrs = {f"{self.ip(c)}:7946" for c in nodes}
        return all(self.health(c) == "healthy" and self.alive_members(c) == addrs for c in nodes)
