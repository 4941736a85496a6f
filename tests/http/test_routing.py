"""Routing a user can see: follow-up turns land where their prefix is cached; load and KV events are tracked."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from node.routing.config import RoutingConfig
from tests.http.conftest import Cluster, start_cluster

pytestmark = pytest.mark.asyncio(loop_scope="module")

SYSTEM = "You are a meticulous assistant. " * 60  # ~400 tokens shared by every turn


async def _conversation_cached_tokens(cluster: Cluster, turns: int) -> list[int]:
    messages = [{"role": "system", "content": SYSTEM}]
    cached = []
    for k in range(turns):
        messages.append({"role": "user", "content": f"Question number {k}: what comes next?"})
        r = await cluster.client.chat.completions.create(
            model=cluster.model,
            messages=messages,
            max_tokens=8,
            seed=k,  # type: ignore[arg-type]
        )
        assert r.usage is not None and r.usage.prompt_tokens_details is not None
        cached.append(r.usage.prompt_tokens_details.cached_tokens or 0)
        messages.append({"role": "assistant", "content": r.choices[0].message.content or ""})
        await asyncio.sleep(0.05)  # the worker publishes the turn's blocks when it finishes
    return cached


async def _readiness(cluster: Cluster) -> dict[str, object]:
    async with aiohttp.ClientSession() as session, session.get(cluster.node.url + "/readiness") as resp:
        return dict(await resp.json())


async def test_cache_aware_keeps_a_conversation_on_its_worker(llama3_model_dir: Path) -> None:
    async with start_cluster(llama3_model_dir, workers=3, routing=RoutingConfig(policy="cache_aware")) as c:
        for _ in range(100):
            workers = (await _readiness(c))["workers"]
            if all(w["kv_events"] == "streaming" for w in workers):  # type: ignore[index, union-attr]
                break
            await asyncio.sleep(0.05)
        cached = await _conversation_cached_tokens(c, turns=4)
        # Every follow-up reuses at least the system prompt's blocks on the worker that holds them.
        assert all(x >= 300 for x in cached[1:]), cached
        ready = await _readiness(c)
        assert ready["policy"] == "cache_aware"
        assert all(w["load"] is not None for w in ready["workers"])  # type: ignore[union-attr]


async def test_round_robin_scatters_the_conversation(llama3_model_dir: Path) -> None:
    async with start_cluster(llama3_model_dir, workers=3) as c:
        cached = await _conversation_cached_tokens(c, turns=4)
        # Consecutive turns go to different workers, which have never seen the conversation.
        assert cached[1] == 0 and cached[2] == 0, cached
