"""API keys across real `smg-node serve` processes: how fast a created key works, and a revoked key stops
working, on every other node.

    .venv/bin/python -m bench.auth_real                 # ~1 min: 3 lan nodes, 30 keys created and revoked
    .venv/bin/python -m bench.auth_real --nodes 5 --keys 50

Each trial creates a `user` key on a random node (POST /admin/keys with the bootstrap key) and polls every
other node's GET /v1/models with it every 10 ms until it answers 200; then revokes it on another random node
(DELETE /admin/keys/{id}) and polls the others until they answer 401. Delays count from the write's answer
(the write is local and done by then): p50/p99/max over every (trial, node) pair.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import aiohttp

from chaos.cluster import LAN_PROFILE, Cluster, Node, free_port, loopback_nodes, sim_worker
from mesh.scenarios import percentile
from node.auth.keys import new_key
from node.models.prepare import prepare_model

FIRST_HOST = 41
POLL_S = 0.01
#: A change not seen within this long is a failure, not a slow sample.
GIVE_UP_S = 30.0


def stats(values: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(percentile(values, 50) * 1000, 1),
        "p99_ms": round(percentile(values, 99) * 1000, 1),
        "max_ms": round(max(values) * 1000, 1),
        "n": len(values),
    }


async def _status(session: aiohttp.ClientSession, node: Node, key: str) -> int:
    async with session.get(node.url + "/v1/models", headers={"Authorization": f"Bearer {key}"}) as r:
        await r.read()
        return r.status


async def _wait_status(session: aiohttp.ClientSession, node: Node, key: str, want: int, t0: float) -> float:
    while True:
        if await _status(session, node, key) == want:
            return time.monotonic() - t0
        if time.monotonic() - t0 > GIVE_UP_S:
            raise TimeoutError(f"{node.name} never answered {want}")
        await asyncio.sleep(POLL_S)


async def propagation(nodes: list[Node], admin: str, keys: int, rng: random.Random) -> dict[str, list[float]]:
    created: list[float] = []
    revoked: list[float] = []
    auth = {"Authorization": f"Bearer {admin}"}
    async with aiohttp.ClientSession() as session:
        for k in range(keys):
            writer = rng.choice(nodes)
            body = {"tenant": f"t{k}", "role": "user"}
            async with session.post(writer.url + "/admin/keys", json=body, headers=auth) as r:
                assert r.status == 201, await r.text()
                made = await r.json()
            t0 = time.monotonic()
            others = [n for n in nodes if n is not writer]
            created += await asyncio.gather(*(_wait_status(session, n, made["key"], 200, t0) for n in others))
            writer = rng.choice(nodes)
            async with session.delete(f"{writer.url}/admin/keys/{made['id']}", headers=auth) as r:
                assert r.status == 200, await r.text()
            t0 = time.monotonic()
            others = [n for n in nodes if n is not writer]
            revoked += await asyncio.gather(*(_wait_status(session, n, made["key"], 401, t0) for n in others))
            assert await _status(session, writer, made["key"]) == 401  # at once where it was revoked
    return {"created": created, "revoked": revoked}


@contextmanager
def keyed_cluster(workdir: Path, nodes_count: int) -> Iterator[tuple[list[Node], str]]:
    """``nodes_count`` meshed nodes requiring API keys, converged; yields them and the bootstrap admin key.
    (``keyed_cluster_of`` also yields the Cluster, to kill nodes.)"""
    with keyed_cluster_of(workdir, nodes_count) as (cluster, admin):
        yield list(cluster.nodes.values()), admin


@contextmanager
def keyed_cluster_of(
    workdir: Path, nodes_count: int, extra: Callable[[str], tuple[str, ...]] = lambda _name: ()
) -> Iterator[tuple[Cluster, str]]:
    """``extra(name)``: more `serve` flags of the node named ``name``."""
    with ExitStack() as stack:
        model_dir = prepare_model("llama3", workdir / "models")
        worker = stack.enter_context(sim_worker(model_dir, workdir / "sim.log"))
        admin, _ = new_key()
        key_file = workdir / "bootstrap.key"
        key_file.write_text(admin + "\n")
        key_file.chmod(0o600)
        port = free_port([f"127.0.0.{k}" for k in range(FIRST_HOST, FIRST_HOST + nodes_count)])
        cluster = stack.enter_context(
            Cluster(workdir=workdir, model_dir=model_dir, worker_url=worker, profile=LAN_PROFILE, api_key=admin)
        )
        for node in loopback_nodes(nodes_count, mesh_port=port, first_host=FIRST_HOST, name_prefix="k"):
            node.extra = ("--auth-bootstrap-key-file", str(key_file), *extra(node.name))
            cluster.add(node)
        nodes = list(cluster.nodes.values())
        cluster.start(*nodes)
        cluster.wait_up(*nodes)
        cluster.wait_converged(nodes, timeout_s=60)
        yield cluster, admin


def run(workdir: Path, nodes_count: int, keys: int, seed: int) -> dict[str, Any]:
    with keyed_cluster(workdir, nodes_count) as (nodes, admin):
        delays = asyncio.run(propagation(nodes, admin, keys, random.Random(seed)))
    return {
        "nodes": nodes_count,
        "profile": LAN_PROFILE.label,
        "create": stats(delays["created"]),
        "revoke": stats(delays["revoked"]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--keys", type=int, default=30)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="auth-real-") as tmp:
        result = run(Path(tmp), args.nodes, args.keys, args.seed)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
