"""`smg-node sim-worker` and `smg-node serve` as real processes, as a user runs them; a worker killed -9."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest

from node.auth.keys import new_key
from tests.procs import SMG_NODE, free_port, http_status, port_open, process, wait_until


@dataclass
class Procs:
    url: str
    sim_pid: int
    node_pid: int


@pytest.fixture
def two_processes(llama3_model_dir: Path, tmp_path: Path) -> Iterator[Procs]:
    sim_port, http_port = free_port(), free_port()
    sim_args = [*SMG_NODE, "sim-worker", "--port", str(sim_port), "--model-path", str(llama3_model_dir)]
    sim_args += ["--tpot-ms", "5", "--ttft-base-ms", "1"]
    node_args = [*SMG_NODE, "serve", "--port", str(http_port), "--model-path", str(llama3_model_dir)]
    node_args += ["--worker", f"grpc://127.0.0.1:{sim_port}", "--health-interval-s", "0.3"]
    with process(sim_args, log=tmp_path / "sim.log") as sim:
        wait_until(lambda: port_open(sim_port), timeout_s=30, what="the sim worker to listen")
        # Flags override the environment: this bogus env value must not win.
        with process(node_args, log=tmp_path / "node.log", env={"SMG_NODE_PORT": "1"}) as node:
            url = f"http://127.0.0.1:{http_port}"
            wait_until(lambda: http_status(url + "/readiness") == 200, timeout_s=30, what="node readiness")
            yield Procs(url=url, sim_pid=sim.pid, node_pid=node.pid)


def test_openai_client_against_real_processes(two_processes: Procs) -> None:
    client = openai.OpenAI(base_url=two_processes.url + "/v1", api_key="unused", max_retries=0, timeout=30)
    models = client.models.list()
    name = models.data[0].id
    assert name == "llama3", "the served name defaults to what the worker's GetModelInfo reports"
    r = client.chat.completions.create(
        model=name, messages=[{"role": "user", "content": "Say something"}], max_tokens=8, stop=["zzzz"]
    )
    assert r.choices[0].message.content and r.usage is not None and r.usage.completion_tokens == 8
    stream = client.completions.create(model=name, prompt="Once", max_tokens=5, stream=True)
    assert "".join(c.choices[0].text for c in stream if c.choices)


def test_worker_killed_mid_stream_ends_the_stream_with_an_error(two_processes: Procs) -> None:
    client = openai.OpenAI(base_url=two_processes.url + "/v1", api_key="unused", max_retries=0, timeout=30)
    stream = client.chat.completions.create(
        model="llama3",
        messages=[{"role": "user", "content": "Tell me a long story"}],
        max_tokens=2000,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    received = 0
    with pytest.raises(openai.APIError) as info:
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                received += 1
                if received == 5:
                    os.kill(two_processes.sim_pid, signal.SIGKILL)
    assert received >= 5
    assert "worker" in str(info.value).lower()
    # The node itself keeps serving: liveness is fine, readiness reports no healthy worker.
    assert http_status(two_processes.url + "/health") == 200
    wait_until(lambda: http_status(two_processes.url + "/readiness") == 503, timeout_s=10, what="readiness 503")
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError) as status:
        client.chat.completions.create(model="llama3", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert status.value.status_code == 503
    assert time.monotonic() - started < 5, "no healthy worker fails fast"


def _pids(url: str, tries: int = 60) -> set[int]:
    """PIDs answering /health: new connections are spread over the processes sharing the port."""
    seen: set[int] = set()
    for _ in range(tries):
        with urllib.request.urlopen(url + "/health", timeout=5) as resp:
            seen.add(int(json.loads(resp.read())["pid"]))
    return seen


def test_processes_share_the_port_and_a_dead_one_is_replaced(llama3_model_dir: Path, tmp_path: Path) -> None:
    sim_port, http_port = free_port(), free_port()
    sim_args = [*SMG_NODE, "sim-worker", "--port", str(sim_port), "--model-path", str(llama3_model_dir)]
    node_args = [*SMG_NODE, "serve", "--port", str(http_port), "--model-path", str(llama3_model_dir)]
    node_args += ["--worker", f"grpc://127.0.0.1:{sim_port}", "--processes", "2"]
    # Several processes need shared history (memory history is private to one process).
    node_args += ["--history-backend", "redis", "--redis-url", "redis://127.0.0.1:6379/0"]
    url = f"http://127.0.0.1:{http_port}"
    with process(sim_args, log=tmp_path / "sim.log"), process(node_args, log=tmp_path / "node.log"):
        wait_until(lambda: http_status(url + "/readiness") == 200, timeout_s=60, what="node readiness")
        wait_until(lambda: len(_pids(url, 20)) == 2, timeout_s=60, what="both processes serving")
        first = _pids(url)
        # Kill process 0, the one the others joined first: its replacement must find the survivor by itself.
        victim = next(pid for pid in first if _process_index(pid) == 0)
        os.kill(victim, signal.SIGKILL)
        # The survivor keeps answering meanwhile; the supervisor starts a replacement.
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=2, timeout=30)
        r = client.completions.create(model="llama3", prompt="hi", max_tokens=3)
        assert r.choices[0].text
        wait_until(lambda: len(_pids(url, 20) - {victim}) == 2, timeout_s=60, what="a replacement process")

        # The processes form a private mesh: a worker registered through whichever process the kernel picks
        # is listed by every process, the replacement included.
        extra = f"grpc://127.0.0.1:{free_port()}"
        req = urllib.request.Request(
            url + "/workers", data=json.dumps({"url": extra}).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.status == 201
        # Within a few gossip rounds of the local profile, well under its 15 s push-pull interval.
        wait_until(lambda: _all_list(url, extra), timeout_s=10, what="every process listing the new worker")


def test_every_process_serves_the_admin_listener(llama3_model_dir: Path, tmp_path: Path) -> None:
    """`--admin-bind HOST:0 --processes 2`: the supervisor pins one admin port for all its children (printed),
    each binds it with SO_REUSEPORT (before, the second bind failed and that child crash-looped), each answers
    admin calls on state they share, and the admin API stays up while a dead process is replaced."""
    bootstrap, _ = new_key()
    sim_port, http_port = free_port(), free_port()
    sim_args = [*SMG_NODE, "sim-worker", "--port", str(sim_port), "--model-path", str(llama3_model_dir)]
    node_args = [*SMG_NODE, "serve", "--port", str(http_port), "--model-path", str(llama3_model_dir)]
    node_args += ["--worker", f"grpc://127.0.0.1:{sim_port}", "--processes", "2", "--admin-bind", "127.0.0.1:0"]
    node_args += ["--history-backend", "redis", "--redis-url", "redis://127.0.0.1:6379/0"]
    url = f"http://127.0.0.1:{http_port}"
    log = tmp_path / "node.log"
    with (
        process(sim_args, log=tmp_path / "sim.log"),
        process(node_args, log=log, env={"SMG_NODE_AUTH_BOOTSTRAP_KEY": bootstrap}) as supervisor,
    ):
        wait_until(lambda: "serves the admin API on" in log.read_text(), timeout_s=30, what="the admin address")
        admin_port = int(re.findall(r"serves the admin API on 127\.0\.0\.1:(\d+)", log.read_text())[0])
        assert admin_port != 0
        admin = f"http://127.0.0.1:{admin_port}"
        wait_until(lambda: port_open(http_port) and port_open(admin_port), timeout_s=60, what="the listeners")
        wait_until(lambda: len(_pids(url, 20)) == 2, timeout_s=60, what="both processes serving")
        serving = _pids(url)
        wait_until(lambda: _admin_pids(admin, bootstrap) == serving, timeout_s=30, what="both on the admin port")
        children = [pid for pid in _all_pids() if _ppid(pid) == supervisor.pid]
        assert sorted(children) == sorted(serving) and "exited with" not in log.read_text()
        with pytest.raises(urllib.error.HTTPError) as public:
            _admin(url, bootstrap, "/workers")
        assert public.value.code == 404  # the main port does not serve the admin API

        # Whichever process takes the call, every process lists the worker it adds (shared through their mesh).
        extra = f"grpc://127.0.0.1:{free_port()}"
        assert _admin(admin, bootstrap, "/workers", {"url": extra})[0] == 201
        wait_until(lambda: _admin_all_list(admin, bootstrap, extra), timeout_s=10, what="every process listing it")

        victim = next(iter(serving))
        os.kill(victim, signal.SIGKILL)
        # The survivor answers meanwhile (a connection the kernel had queued on the dead socket is reset: retried).
        wait_until(lambda: _admin_status(admin, bootstrap) == 200, timeout_s=5, what="the survivor answering")
        wait_until(lambda: len(_admin_pids(admin, bootstrap) - {victim}) == 2, timeout_s=60, what="a replacement")


def _admin(base: str, key: str, path: str, body: object = None) -> tuple[int, dict[str, Any]]:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    with urllib.request.urlopen(urllib.request.Request(base + path, data=data, headers=headers), timeout=10) as r:
        return r.status, json.loads(r.read())


def _admin_status(base: str, key: str) -> int | None:
    try:
        return _admin(base, key, "/workers")[0]
    except (ConnectionError, urllib.error.URLError):
        return None


def _admin_pids(base: str, key: str, tries: int = 30) -> set[int]:
    """PIDs answering the admin listener's /status.json over new connections (a reset one skipped: around a
    kill -9 the kernel resets what it had queued on the dead process's socket)."""
    seen: set[int] = set()
    for _ in range(tries):
        with contextlib.suppress(ConnectionError, urllib.error.URLError):
            seen.add(int(_admin(base, key, "/status.json")[1]["node"]["pid"]))
    return seen


def _admin_all_list(base: str, key: str, worker: str, tries: int = 20) -> bool:
    seen: dict[int, bool] = {}
    for _ in range(tries):
        pid = int(_admin(base, key, "/status.json")[1]["node"]["pid"])
        listed = {w["url"] for w in _admin(base, key, "/workers")[1]["data"]}
        seen[pid] = seen.get(pid, True) and worker in listed
    return len(seen) == 2 and all(seen.values())


def test_children_exit_with_a_killed_supervisor(llama3_model_dir: Path, tmp_path: Path) -> None:
    sim_port, http_port = free_port(), free_port()
    sim_args = [*SMG_NODE, "sim-worker", "--port", str(sim_port), "--model-path", str(llama3_model_dir)]
    node_args = [*SMG_NODE, "serve", "--port", str(http_port), "--model-path", str(llama3_model_dir)]
    node_args += ["--worker", f"grpc://127.0.0.1:{sim_port}", "--processes", "2"]
    node_args += ["--history-backend", "redis", "--redis-url", "redis://127.0.0.1:6379/0"]
    url = f"http://127.0.0.1:{http_port}"
    with process(sim_args, log=tmp_path / "sim.log"), process(node_args, log=tmp_path / "node.log") as supervisor:
        wait_until(lambda: http_status(url + "/readiness") == 200, timeout_s=60, what="node readiness")
        wait_until(lambda: len(_pids(url, 20)) == 2, timeout_s=60, what="both processes serving")
        children = [pid for pid in _all_pids() if _ppid(pid) == supervisor.pid]
        assert len(children) == 2
        os.kill(supervisor.pid, signal.SIGKILL)
        supervisor.wait(timeout=5)
        started = time.monotonic()
        # Each child drains as on SIGTERM: it stops accepting first...
        wait_until(lambda: not port_open(http_port), timeout_s=STOP_SERVING_WITHIN_S, what="the port to close")
        # ...and exits once idle; the siblings' private mesh leave waits out its timeout, all members leaving.
        wait_until(lambda: all(_exited(pid) for pid in children), timeout_s=20, what="the children to exit")
        assert time.monotonic() - started < CHILDREN_EXIT_WITHIN_S


#: An unsupervised child must not serve on: it closes its listener at once on its supervisor's death.
STOP_SERVING_WITHIN_S = 2.0
#: Idle children exit within ~1 s of that, plus the mesh's leave timeout (5 s): when every member of the
#: siblings' private mesh leaves at once, nobody is left to gossip the leave to.
CHILDREN_EXIT_WITHIN_S = 2.0 + 5.0


def _all_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _stat_fields(pid: int) -> list[bytes] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return raw.rsplit(b")", 1)[1].split()  # [state, ppid, ...]: the name before may hold spaces


def _ppid(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[1]) if fields else None


def _exited(pid: int) -> bool:
    fields = _stat_fields(pid)
    return fields is None or fields[0] == b"Z"


def _process_index(pid: int) -> int:
    """The supervisor's index of a node process, from the environment it was started with."""
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return int(next(v for v in environ if v.startswith(b"SMG_NODE_PROCESS_INDEX=")).split(b"=", 1)[1])


def _all_list(url: str, worker: str, tries: int = 20) -> bool:
    """Whether every one of ``tries`` new connections gets a /workers listing that holds ``worker``."""
    seen: dict[int, bool] = {}
    for _ in range(tries):
        with urllib.request.urlopen(url + "/health", timeout=5) as resp:
            pid = int(json.loads(resp.read())["pid"])
        with urllib.request.urlopen(url + "/workers", timeout=5) as resp:
            listed = {w["url"] for w in json.loads(resp.read())["data"]}
        seen[pid] = seen.get(pid, True) and worker in listed
    return all(seen.values())


def test_several_processes_refuse_private_memory_history(llama3_model_dir: Path) -> None:
    import subprocess

    args = [*SMG_NODE, "serve", "--model-path", str(llama3_model_dir), "--worker", "grpc://127.0.0.1:1"]
    done = subprocess.run([*args, "--processes", "2"], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "--history-backend redis or postgres" in done.stderr
