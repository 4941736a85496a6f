"""Cluster state measured with real `smg-node serve` processes: how fast a change reaches every node, and what
the state costs on the wire and in memory.

    .venv/bin/python -m bench.state_real                  # ~2 min: 5 lan nodes, 60 changes, 60 s of load churn
    .venv/bin/python -m bench.state_real --changes 20 --churn-seconds 20

* Propagation: 5 nodes (lan profile, the default) on 127.0.0.31..35. Each trial registers a worker
  (POST /workers) on a random node, or removes the previous one (DELETE), and polls every other node's
  GET /workers every 10 ms until it shows the change; the delay is counted from the answer of the write
  (the write is local and done by then). p50/p99/max over every (trial, node) pair.
* Churn: with 4 live simulated workers and 16 unreachable ones registered, every node health-checks all
  20 each second (--health-interval-s 1) while a load generator keeps the live ones busy, so every node's
  health row changes load values continually; verdict flips of the unreachable ones are steady state.
  Per node: mesh bytes out per second (smg_node_mesh_bytes_out_total, UDP and TCP, membership included) and
  the state's encoded size (smg_node_state_doc_bytes), over the window.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import aiohttp

from chaos.cluster import LAN_PROFILE, Cluster, Node, free_port, loopback_nodes, sim_worker
from mesh.scenarios import percentile
from node.models.prepare import prepare_model

NODES = 5
FIRST_HOST = 31
POLL_S = 0.01
LIVE_WORKERS = 4
DEAD_WORKERS = 16


def _stats(values: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(percentile(values, 50) * 1000, 1),
        "p99_ms": round(percentile(values, 99) * 1000, 1),
        "max_ms": round(max(values) * 1000, 1),
        "n": len(values),
    }


async def _listed(session: aiohttp.ClientSession, node: Node) -> set[str]:
    async with session.get(node.url + "/workers") as r:
        body = await r.json()
    return {w["url"] for w in body["data"]}


async def _wait_seen(session: aiohttp.ClientSession, node: Node, url: str, present: bool, t0: float) -> float:
    deadline = t0 + 30
    while True:
        if (url in await _listed(session, node)) == present:
            return time.monotonic() - t0
        if time.monotonic() > deadline:
            raise TimeoutError(f"{node.name} never saw the change of {url}")
        await asyncio.sleep(POLL_S)


async def propagation(nodes: list[Node], changes: int, rng: random.Random) -> list[float]:
    delays: list[float] = []
    port = 40000
    async with aiohttp.ClientSession() as session:
        for _ in range(changes // 2):
            port += 1
            url = f"grpc://127.0.0.1:{port}"  # nothing listens: registration does not need the worker
            for present in (True, False):
                writer = rng.choice(nodes)
                if present:
                    async with session.post(writer.url + "/workers", json={"url": url}) as r:
                        wid = (await r.json())["id"]
                else:
                    async with session.delete(f"{writer.url}/workers/{wid}") as r:
                        assert r.status == 200
                t0 = time.monotonic()
                others = [n for n in nodes if n is not writer]
                delays += await asyncio.gather(*(_wait_seen(session, n, url, present, t0) for n in others))
    return delays


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def churn(nodes: list[Node], live: list[str], seconds: float) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session:
        for k, url in enumerate(live):
            async with session.post(nodes[k % len(nodes)].url + "/workers", json={"url": url}) as r:
                assert r.status in (200, 201)
        for k in range(DEAD_WORKERS):
            async with session.post(
                nodes[k % len(nodes)].url + "/workers", json={"url": f"grpc://127.0.0.1:{45000 + k}"}
            ):
                pass
        await asyncio.sleep(5)  # every node registers and checks everything once

        async def scrape() -> list[tuple[float, float]]:
            out = []
            for n in nodes:
                async with session.get(n.url + "/metrics") as r:
                    text = await r.text()
                out.append((_metric(text, "smg_node_mesh_bytes_out_total"), _metric(text, "smg_node_state_doc_bytes")))
            return out

        async with session.get(nodes[0].url + "/v1/models") as r:
            model = (await r.json())["data"][0]["id"]
        stop = time.monotonic() + seconds

        async def load() -> None:
            body = {"model": model, "messages": [{"role": "user", "content": "churn"}], "max_tokens": 16}
            k = 0
            while time.monotonic() < stop:
                k += 1
                async with session.post(nodes[k % len(nodes)].url + "/v1/chat/completions", json=body) as r:
                    await r.read()

        before, t0 = await scrape(), time.monotonic()
        await asyncio.gather(*(load() for _ in range(8)))
        after, elapsed = await scrape(), time.monotonic() - t0
    rates = [(a[0] - b[0]) / elapsed for a, b in zip(after, before, strict=True)]
    return {
        "window_s": round(elapsed, 1),
        "registered_workers": len(live) + DEAD_WORKERS,
        "mesh_bytes_out_per_s": {"median": round(sorted(rates)[len(rates) // 2]), "max": round(max(rates))},
        "state_doc_bytes": {"max": int(max(a[1] for a in after))},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--changes", type=int, default=60)
    parser.add_argument("--churn-seconds", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="state-real-") as tmp, ExitStack() as stack:
        workdir = Path(tmp)
        model_dir = prepare_model("llama3", workdir / "models")
        live = [stack.enter_context(sim_worker(model_dir, workdir / f"sim{k}.log")) for k in range(LIVE_WORKERS)]
        port = free_port([f"127.0.0.{k}" for k in range(FIRST_HOST, FIRST_HOST + NODES)])
        cluster = stack.enter_context(
            Cluster(workdir=workdir, model_dir=model_dir, worker_url=live[0], profile=LAN_PROFILE)
        )
        for node in loopback_nodes(NODES, mesh_port=port, first_host=FIRST_HOST, name_prefix="s"):
            node.extra = ("--health-interval-s", "1")
            cluster.add(node)
        nodes = list(cluster.nodes.values())
        cluster.start(*nodes)
        cluster.wait_up(*nodes)
        cluster.wait_converged(nodes, timeout_s=60)
        delays = asyncio.run(propagation(nodes, args.changes, random.Random(args.seed)))
        result: dict[str, Any] = {"nodes": NODES, "profile": LAN_PROFILE.label, "propagation": _stats(delays)}
        result["churn"] = asyncio.run(churn(nodes, live, args.churn_seconds))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
