"""Workers are cluster state: real node processes share the registry and the health verdicts.

Three `smg-node serve` processes in a mesh and simulated workers of their own: a worker added on one node
is listed and routed to by every node; the node that added it can die (kill -9) without the worker going
with it; a worker that dies is out on every node within two health intervals.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chaos.cluster import (
    SMG_NODE,
    Cluster,
    Node,
    Profile,
    free_port,
    kill_process,
    loopback_nodes,
    start_process,
    wait_until,
)
from tests.procs import port_open

NODES = 3
HEALTH_INTERVAL_S = 0.5
#: Two health intervals is the bound; the rest is headroom for two busy cores and the polling.
OUT_BOUND_S = 2 * HEALTH_INTERVAL_S
SLACK_S = 1.5


def _request(method: str, url: str, body: object | None = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _workers(node: Node) -> dict[str, Any]:
    try:
        status, body = _request("GET", node.url + "/workers")
    except OSError:
        return {}
    return {w["url"]: w for w in body["data"]} if status == 200 else {}


class _Sim:
    def __init__(self, model_dir: Path, log: Path) -> None:
        self.port = free_port(["127.0.0.1"])
        self.url = f"grpc://127.0.0.1:{self.port}"
        args = [
            *SMG_NODE,
            "sim-worker",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--model-path",
            str(model_dir),
        ]
        self.proc = start_process(args, log)
        wait_until(lambda: port_open(self.port), timeout_s=60, what="a sim worker", interval_s=0.1)

    def kill(self) -> None:
        kill_process(self.proc)


@pytest.fixture(scope="module")
def three(
    model_dir: Path, worker_url: str, profile: Profile, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    workdir = tmp_path_factory.mktemp("workers")
    port = free_port([f"127.0.0.{k}" for k in range(21, 21 + NODES)])
    with Cluster(workdir=workdir, model_dir=model_dir, worker_url=worker_url, profile=profile) as cluster:
        for node in loopback_nodes(NODES, mesh_port=port, first_host=21, name_prefix="w"):
            node.extra = ("--health-interval-s", str(HEALTH_INTERVAL_S), "--health-publish-interval-s", "1")
            cluster.add(node)
        nodes = list(cluster.nodes.values())
        cluster.start(*nodes)
        cluster.wait_up(*nodes)
        cluster.wait_converged(nodes, timeout_s=60)
        yield cluster


def _chat(node: Node) -> int:
    _, models = _request("GET", node.url + "/v1/models")
    body = {"model": models["data"][0]["id"], "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    status, _ = _request("POST", node.url + "/v1/chat/completions", body)
    return status


def test_a_worker_added_on_one_node_is_everywhere_and_outlives_it(
    three: Cluster, model_dir: Path, tmp_path: Path
) -> None:
    n1, n2, n3 = three.nodes.values()
    sim = _Sim(model_dir, tmp_path / "sim.log")
    try:
        status, added = _request("POST", n3.url + "/workers", {"url": sim.url, "labels": {"rack": "r7"}})
        assert status == 201, added
        t0 = time.monotonic()
        seen: dict[str, float] = {}

        def everywhere() -> bool:
            for node in (n1, n2):
                if node.name not in seen and sim.url in _workers(node):
                    seen[node.name] = time.monotonic() - t0
            return len(seen) == 2

        wait_until(everywhere, timeout_s=10, what="the new worker on every node", interval_s=0.02)
        assert max(seen.values()) < 5, seen  # typically one gossip round (~0.1 s); the benchmark measures it

        three.kill(n3)  # the node that registered it dies
        wait_until(
            lambda: all(_workers(n).get(sim.url, {}).get("routable_here") for n in (n1, n2)),
            timeout_s=20,
            what="the worker routable on the survivors",
        )
        time.sleep(1.0)  # past a few state ticks: nothing garbage-collects a dead node's workers
        for node in (n1, n2):
            listed = _workers(node)
            assert sim.url in listed and listed[sim.url]["labels"] == {"rack": "r7"}
        status, _ = _request("DELETE", f"{n1.url}/workers/{listed[sim.url]['id']}")
        assert status == 200
        wait_until(lambda: sim.url not in _workers(n2), timeout_s=10, what="the removal on n2")
    finally:
        sim.kill()
        three.start(n3)
        three.wait_up(n3)


def test_a_dead_worker_is_out_everywhere_within_two_health_intervals(
    three: Cluster, model_dir: Path, tmp_path: Path
) -> None:
    nodes = list(three.nodes.values())
    sim = _Sim(model_dir, tmp_path / "sim.log")
    try:
        assert _request("POST", nodes[0].url + "/workers", {"url": sim.url})[0] == 201
        wait_until(
            lambda: all(_workers(n).get(sim.url, {}).get("verdict") == "healthy" for n in nodes),
            timeout_s=20,
            what="the worker healthy everywhere",
        )
        sim.kill()
        t0 = time.monotonic()
        out: dict[str, float] = {}

        def out_everywhere() -> bool:
            for node in nodes:
                if node.name not in out:
                    w = _workers(node).get(sim.url, {})
                    if w.get("verdict") == "unhealthy" and not w.get("routable_here"):
                        out[node.name] = time.monotonic() - t0
            return len(out) == len(nodes)

        wait_until(out_everywhere, timeout_s=OUT_BOUND_S + SLACK_S + 5, what="the dead worker out everywhere")
        assert max(out.values()) <= OUT_BOUND_S + SLACK_S, out
        for node in nodes:  # the shared worker still serves: requests keep working
            assert _chat(node) == 200
        _, listing = _request("GET", nodes[1].url + "/workers")
        wid = next(w["id"] for w in listing["data"] if w["url"] == sim.url)
        assert _request("DELETE", f"{nodes[1].url}/workers/{wid}")[0] == 200
    finally:
        sim.kill()
