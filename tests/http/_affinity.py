"""Shared setup of the cross-node cache-affinity tests: four simulated workers that publish no KV events (only
the routing hints shared over the mesh can tell where a prefix is cached), a first node ``a`` on a mesh, and
conversations begun on it."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from node.app import RunningNode, run_node
from node.cluster.config import ClusterConfig
from node.config import NodeConfig
from node.routing.config import RoutingConfig
from node.sim.worker import SimWorker
from tests.http.conftest import fast_sim, node_config

CONVERSATIONS = 8
MESH = ClusterConfig(mesh_bind="127.0.0.1:0", mesh_profile="local", mesh_probe_interval_s=0.2)

Messages = list[dict[str, str]]


async def chat(base: str, model: str, messages: Messages) -> tuple[int, Any]:
    body = {"model": model, "messages": messages, "max_tokens": 8}
    async with aiohttp.ClientSession() as s, s.post(base + "/v1/chat/completions", json=body) as r:
        return r.status, await r.json()


async def hints_received(base: str) -> float:
    """The node's hint messages received by gossip (its /metrics)."""
    async with aiohttp.ClientSession() as s, s.get(base + "/metrics") as r:
        text = await r.text()
    line = next(x for x in text.splitlines() if x.startswith("smg_node_hint_messages_received_total"))
    return float(line.rsplit(" ", 1)[1])


async def until(predicate: Callable[[], bool], what: str, tries: int = 200) -> None:
    for _ in range(tries):
        if predicate():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def routable(node: RunningNode) -> None:
    """Every worker in rotation on ``node``."""
    await until(
        lambda: len(node.pool.workers) == 4 and all(node.pool.routable(w) for w in node.pool.workers), "workers"
    )


async def wait_for_gossiped_hints(node: RunningNode) -> None:
    """Until ``node`` has received hints by gossip (or 5 s have passed), and a little more for the last ones."""
    for _ in range(100):
        if await hints_received(node.url) > 0:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)  # the last hints ride a later tick


async def first_node(
    stack: contextlib.AsyncExitStack, model_dir: Path
) -> tuple[list[SimWorker], NodeConfig, RunningNode]:
    """The four workers, the node config every node of the test shares (with cache_aware routing), and node a
    on the mesh."""
    sims = [await stack.enter_async_context(SimWorker(fast_sim(model_dir, kv_events=False))) for _ in range(4)]
    base = node_config(model_dir, [s.port for s in sims], RoutingConfig(policy="cache_aware"))
    a = await stack.enter_async_context(run_node(dataclasses.replace(base, cluster=MESH)))
    assert a.mesh is not None
    return sims, base, a


def joining(a: RunningNode) -> ClusterConfig:
    """The mesh config of a node that joins ``a``."""
    assert a.mesh is not None
    return dataclasses.replace(MESH, join=(a.mesh.addr,))


def _served_by(sims: list[SimWorker], before: list[int]) -> int:
    """The index of the worker that completed a request since ``before``."""
    after = [s.engine.completed_requests for s in sims]
    return next(i for i, (x, y) in enumerate(zip(before, after, strict=True)) if y > x)


async def begin_conversations(a: RunningNode, sims: list[SimWorker]) -> tuple[list[int], list[Messages]]:
    """A warm-up on ``a`` only (its choices are then shifted from what another node, starting empty, would
    choose blind), then the first turn of CONVERSATIONS conversations on ``a``: the worker each went to, and
    each history with its next user turn appended."""
    model = a.model.name
    assert (await chat(a.url, model, [{"role": "user", "content": "warm-up " * 40}]))[0] == 200
    first: list[int] = []
    histories: list[Messages] = []
    for k in range(CONVERSATIONS):
        system = f"You are assistant number {k}. " + " ".join(f"rule {k}-{i} applies." for i in range(60))
        messages = [{"role": "system", "content": system}, {"role": "user", "content": f"question {k}"}]
        before = [s.engine.completed_requests for s in sims]
        status, answer = await chat(a.url, model, messages)
        assert status == 200, answer
        first.append(_served_by(sims, before))
        messages += [answer["choices"][0]["message"], {"role": "user", "content": "and then?"}]
        histories.append(messages)
    assert len(set(first)) > 1, "a put every conversation on one worker: nothing to tell apart"
    return first, histories


async def assert_follow_ups_find_their_workers(
    node: RunningNode, sims: list[SimWorker], first: list[int], histories: list[Messages]
) -> None:
    """The next turn of every conversation, sent to ``node``, goes to the worker its first turn went to."""
    for k, messages in enumerate(histories):
        before = [s.engine.completed_requests for s in sims]
        status, _ = await chat(node.url, node.model.name, messages)
        assert status == 200
        second = _served_by(sims, before)
        assert second == first[k], f"conversation {k}: turn 1 on worker {first[k]}, turn 2 on {second}"
