"""`smg-node join` and `smg-node members` against real nodes: a node started alone joins on request."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos.cluster import REPO, SMG_NODE, Cluster, Profile, alive_names, fetch_view, free_port, loopback_nodes

COLUMNS = ["NAME", "MESH ADDRESS", "HTTP ADDRESS", "STATE", "INCARNATION", "SINCE CHANGE"]
CLI_TIMEOUT_S = 60.0


def smg_node(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SMG_NODE, *args], cwd=REPO, capture_output=True, text=True, timeout=CLI_TIMEOUT_S, check=False
    )


@pytest.fixture(scope="module")
def three(
    model_dir: Path, worker_url: str, profile: Profile, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """n1 (seed) and n2 form a cluster; n3 starts without --join."""
    port = free_port([f"127.0.0.{k}" for k in range(11, 14)])
    with Cluster(
        workdir=tmp_path_factory.mktemp("cli"), model_dir=model_dir, worker_url=worker_url, profile=profile
    ) as cluster:
        nodes = loopback_nodes(3, mesh_port=port, first_host=11)
        nodes[2].join = ()
        for node in nodes:
            cluster.add(node)
        cluster.start(*nodes)
        cluster.wait_up(*nodes)
        yield cluster


def test_join_command_makes_a_lone_node_a_member_everywhere(three: Cluster) -> None:
    n1, n2, n3 = three["n1"], three["n2"], three["n3"]
    three.wait_converged([n1, n2], timeout_s=30)
    lone = fetch_view(n3.url)
    assert lone is not None and alive_names(lone) == {"n3"}, "without --join a node is alone"

    done = smg_node("join", n1.mesh_addr, "--node", n3.url)
    assert done.returncode == 0, done.stderr
    assert "joined through 1 peer(s)" in done.stdout, done.stdout
    three.wait_converged([n1, n2, n3], timeout_s=30)

    table = smg_node("members", "--node", n2.url)
    assert table.returncode == 0, table.stderr
    header, *rows = table.stdout.splitlines()
    assert re.split(r"\s{2,}", header.strip()) == COLUMNS, header
    by_name = {row.split()[0]: row for row in rows}
    assert sorted(by_name) == ["n1", "n2", "n3"], table.stdout
    for name, row in by_name.items():
        assert three[name].mesh_addr in row and " alive " in row, row

    as_json = smg_node("members", "--node", n2.url, "--json")
    assert as_json.returncode == 0, as_json.stderr
    body = json.loads(as_json.stdout)
    assert body["self"] == "n2"
    assert {m["name"]: m["state"] for m in body["members"]} == {"n1": "alive", "n2": "alive", "n3": "alive"}


def test_cli_errors_name_the_problem(three: Cluster) -> None:
    closed = free_port(["127.0.0.1"])
    done = smg_node("members", "--node", f"http://127.0.0.1:{closed}")
    assert done.returncode != 0 and "cannot reach" in done.stderr, done.stderr
    bad = smg_node("join", "not-an-address", "--node", three["n3"].url)
    assert bad.returncode != 0 and "peers[0]" in bad.stderr, bad.stderr
