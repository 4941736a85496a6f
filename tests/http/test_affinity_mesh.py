"""Cache affinity across nodes: the next turn of a conversation, sent to another node of the mesh, goes to the
worker the first node sent the conversation to (workers that publish no KV events, so only the routing hints
shared over the mesh can tell)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from pathlib import Path
from typing import Any

import aiohttp

from node.app import run_node
from node.cluster import ClusterConfig
from node.routing.config import RoutingConfig
from node.sim.worker import SimWorker
from tests.http.conftest import fast_sim, node_config

CONVERSATIONS = 8


async def _chat(base: str, model: str, messages: list[dict[str, str]]) -> tuple[int, Any]:
    body = {"model": model, "messages": messages, "max_tokens": 8}
    async with aiohttp.ClientSession() as s, s.post(base + "/v1/chat/completions", json=body) as r:
        return r.status, await r.json()


async def _hints_received(base: str) -> float:
    async with aiohttp.ClientSession() as s, s.get(base + "/metrics") as r:
        text = await r.text()
    line = next(x for x in text.splitlines() if x.startswith("smg_node_hint_messages_received_total"))
    return float(line.rsplit(" ", 1)[1])


async def test_a_follow_up_on_another_node_finds_the_conversations_worker(llama3_model_dir: Path) -> None:
    mesh = ClusterConfig(mesh_bind="127.0.0.1:0", mesh_profile="local", mesh_probe_interval_s=0.2)
    async with contextlib.AsyncExitStack() as stack:
        sims = [
            await stack.enter_async_context(SimWorker(fast_sim(llama3_model_dir, kv_events=False))) for _ in range(4)
        ]
        base = node_config(llama3_model_dir, [s.port for s in sims], RoutingConfig(policy="cache_aware"))
        a = await stack.enter_async_context(run_node(dataclasses.replace(base, cluster=mesh)))
        assert a.mesh is not None
        b_mesh = dataclasses.replace(mesh, join=(a.mesh.addr,))
        b = await stack.enter_async_context(run_node(dataclasses.replace(base, cluster=b_mesh)))
        model = a.model.name
        for node in (a, b):  # every worker in rotation on both nodes
            for _ in range(200):
                if len(node.pool.workers) == 4 and all(node.pool.routable(w) for w in node.pool.workers):
                    break
                await asyncio.sleep(0.05)
        # A warm-up on a only: a's choices are now shifted from what b, starting empty, would choose blind.
        assert (await _chat(a.url, model, [{"role": "user", "content": "warm-up " * 40}]))[0] == 200

        def served() -> list[int]:
            return [s.engine.completed_requests for s in sims]

        first: list[int] = []
        histories: list[list[dict[str, str]]] = []
        for k in range(CONVERSATIONS):
            system = f"You are assistant number {k}. " + " ".join(f"rule {k}-{i} applies." for i in range(60))
            messages = [{"role": "system", "content": system}, {"role": "user", "content": f"question {k}"}]
            before = served()
            status, answer = await _chat(a.url, model, messages)
            assert status == 200, answer
            first.append(next(i for i, (x, y) in enumerate(zip(before, served(), strict=True)) if y > x))
            messages += [answer["choices"][0]["message"], {"role": "user", "content": "and then?"}]
            histories.append(messages)
        assert len(set(first)) > 1, "a put every conversation on one worker: nothing to tell apart"

        for _ in range(100):  # a's hints reach b by gossip
            if await _hints_received(b.url) > 0:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # the last hints ride a later tick

        for k, messages in enumerate(histories):
            before = served()
            status, _ = await _chat(b.url, model, messages)
            assert status == 200
            second = next(i for i, (x, y) in enumerate(zip(before, served(), strict=True)) if y > x)
            assert second == first[k], f"conversation {k}: turn 1 on worker {first[k]}, turn 2 on {second}"
