"""A node that joins the mesh after the conversations began still routes their next turns to the workers holding
their prefixes: the join push-pull hands it the recent routing hints (node/hint_snapshot.py), which best-effort
gossip never repeats."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable
from pathlib import Path

from node.app import RunningNode, run_node
from node.cluster import ClusterConfig
from node.routing.config import RoutingConfig
from node.sim.worker import SimWorker
from tests.http.conftest import fast_sim, node_config
from tests.http.test_affinity_mesh import _chat, _hints_received

CONVERSATIONS = 8


async def _until(predicate: Callable[[], bool], what: str, tries: int = 200) -> None:
    for _ in range(tries):
        if predicate():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def _routable(node: RunningNode) -> None:
    await _until(
        lambda: len(node.pool.workers) == 4 and all(node.pool.routable(w) for w in node.pool.workers), "workers"
    )


async def test_a_late_joiner_sends_a_follow_up_to_the_conversations_worker(llama3_model_dir: Path) -> None:
    mesh = ClusterConfig(mesh_bind="127.0.0.1:0", mesh_profile="local", mesh_probe_interval_s=0.2)
    async with contextlib.AsyncExitStack() as stack:
        sims = [
            await stack.enter_async_context(SimWorker(fast_sim(llama3_model_dir, kv_events=False))) for _ in range(4)
        ]
        base = node_config(llama3_model_dir, [s.port for s in sims], RoutingConfig(policy="cache_aware"))
        a = await stack.enter_async_context(run_node(dataclasses.replace(base, cluster=mesh)))
        assert a.mesh is not None
        joining = dataclasses.replace(mesh, join=(a.mesh.addr,))
        # c is there from the start: a's hints are gossiped to it and out of every broadcast queue before b joins,
        # so b can only learn them from the snapshot.
        c = await stack.enter_async_context(run_node(dataclasses.replace(base, cluster=joining)))
        await _routable(a)
        model = a.model.name
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

        for _ in range(100):
            if await _hints_received(c.url) > 0:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # the last hints ride a later tick
        await _until(lambda: a.shared.hints.queued == 0 and c.shared.hints.queued == 0, "gossip to drain")
        assert len(a.shared.hint_snapshot) > 0

        b = await stack.enter_async_context(run_node(dataclasses.replace(base, cluster=joining)))
        await _routable(b)
        assert b.shared.hint_snapshot.received > 0, "the join push-pull carried no hints"
        assert await _hints_received(b.url) == 0  # none by gossip: the snapshot is all b knows

        for k, messages in enumerate(histories):
            before = served()
            status, _ = await _chat(b.url, model, messages)
            assert status == 200
            second = next(i for i, (x, y) in enumerate(zip(before, served(), strict=True)) if y > x)
            assert second == first[k], f"conversation {k}: turn 1 on worker {first[k]}, turn 2 on {second}"
