"""Cluster-wide rate limits across real `smg-node serve` processes: how many requests N nodes admit in one
window against a key's requests-per-minute limit.

    .venv/bin/python -m bench.limits_real                       # 1 and 3 nodes, limit 300/min, 4 s of load
    .venv/bin/python -m bench.limits_real --nodes 1 3 8 --limit 600

Per N: a `user` key with `requests_per_minute = LIMIT` is created; once every node accepts it, and at least
``--load-s`` before the next minute boundary, ``--clients`` concurrent clients per node send GET /v1/models
(limited like every /v1 route, and cheap, so the offered rate is as high as the machine allows) for
``--load-s`` seconds. Admitted = the 200s; the ratio admitted / limit is the over-admission (1.0 = exact).
The mesh's bound: limit + (N - 1) x r x (tick + propagation), r = a node's admission rate
(mesh/state/counters.py); the offered rate is reported so the bound can be computed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.auth_real import keyed_cluster
from chaos.cluster import Node
from node.auth.limits import WINDOW_S


async def measure(nodes: list[Node], admin: str, limit: int, clients: int, load_s: float) -> dict[str, Any]:
    auth = {"Authorization": f"Bearer {admin}"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        async with session.post(
            nodes[0].url + "/admin/keys", json={"role": "user", "limits": {"requests_per_minute": limit}}, headers=auth
        ) as r:
            made = await r.json()
        # Every node knows the key (its admin listing shows it) before any load.
        for node in nodes:
            while True:
                async with session.get(f"{node.url}/admin/keys/{made['id']}", headers=auth) as r:
                    if r.status == 200:
                        break
                await asyncio.sleep(0.02)
        left = WINDOW_S - time.time() % WINDOW_S
        if left < load_s + 1:
            await asyncio.sleep(left + 0.2)
        window = int(time.time() // WINDOW_S)
        headers = {"Authorization": f"Bearer {made['key']}"}
        admitted = refused = other = 0
        stop = time.monotonic() + load_s

        async def client(node: Node) -> None:
            nonlocal admitted, refused, other
            while time.monotonic() < stop:
                async with session.get(node.url + "/v1/models", headers=headers) as r:
                    await r.read()
                    if int(time.time() // WINDOW_S) != window:
                        return  # (never: the load ends before the boundary)
                    if r.status == 200:
                        admitted += 1
                    elif r.status == 429:
                        refused += 1
                    else:
                        other += 1

        started = time.monotonic()
        await asyncio.gather(*(client(n) for n in nodes for _ in range(clients)))
        elapsed = time.monotonic() - started
    offered = (admitted + refused + other) / elapsed
    return {
        "nodes": len(nodes),
        "limit": limit,
        "admitted": admitted,
        "ratio": round(admitted / limit, 3),
        "refused": refused,
        "errors": other,
        "offered_per_s": round(offered),
        "per_node_offered_per_s": round(offered / len(nodes)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--limit", type=int, default=300)
    parser.add_argument("--clients", type=int, default=4, help="concurrent clients per node")
    parser.add_argument("--load-s", type=float, default=4.0)
    args = parser.parse_args(argv)
    results = []
    for count in args.nodes:
        with (
            tempfile.TemporaryDirectory(prefix="limits-real-") as tmp,
            keyed_cluster(Path(tmp), count) as (nodes, admin),
        ):
            results.append(asyncio.run(measure(nodes, admin, args.limit, args.clients, args.load_s)))
        print(json.dumps(results[-1]), flush=True)
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
