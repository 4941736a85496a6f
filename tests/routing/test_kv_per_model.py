"""Two served models whose engines use different KV block sizes: each model's KV-event index learns its own
block size and indexes its own workers' blocks, and cache_aware routes each model by its own index."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from node.app import RunningNode, run_node
from node.config import ModelConfig
from node.routing.config import RoutingConfig
from node.sim.worker import SimWorker
from tests.http.conftest import fast_sim, node_config

SYSTEM = "You are a meticulous assistant. " * 60  # ~400 tokens: many blocks at either block size


async def _eventually(check: Callable[[], bool], what: str, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def _indexed(node: RunningNode, model: str, sim: SimWorker) -> None:
    """Wait until ``model``'s index says ``sim`` holds blocks."""

    def held() -> bool:
        indexes = node.pool.kv_indexes
        index = indexes.get(model) if indexes is not None else None
        return index is not None and index.blocks_of(f"grpc://127.0.0.1:{sim.port}") > 0

    await _eventually(held, f"{model}'s blocks on {sim.port} indexed")


async def _chat(node: RunningNode, model: str, messages: list[dict[str, str]]) -> dict[str, Any]:
    body = {"model": model, "messages": messages, "max_tokens": 2}
    async with aiohttp.ClientSession() as s, s.post(node.url + "/v1/chat/completions", json=body) as r:
        answer: dict[str, Any] = await r.json()
        assert r.status == 200, answer
        return answer


def _served_by(sims: list[SimWorker], before: list[int]) -> int:
    done = [s.engine.completed_requests - b for s, b in zip(sims, before, strict=True)]
    assert sorted(done) == [0, 1], done
    return done.index(1)


async def test_each_model_is_indexed_and_routed_with_its_own_block_size(
    llama3_model_dir: Path, deepseek_model_dir: Path
) -> None:
    async with contextlib.AsyncExitStack() as stack:
        sims = {
            llama3_model_dir.name: [
                await stack.enter_async_context(SimWorker(fast_sim(llama3_model_dir, block_size=16))) for _ in range(2)
            ],
            deepseek_model_dir.name: [
                await stack.enter_async_context(SimWorker(fast_sim(deepseek_model_dir, block_size=32)))
                for _ in range(2)
            ],
        }
        config = node_config(
            llama3_model_dir,
            [s.port for group in sims.values() for s in group],
            RoutingConfig(policy="cache_aware"),
        )
        config = dataclasses.replace(
            config, model=ModelConfig(model_path=(str(llama3_model_dir), str(deepseek_model_dir)))
        )
        node = await stack.enter_async_context(run_node(config))
        pool = node.pool
        await _eventually(
            lambda: all(pool.routable(w) and w.model for w in pool.workers), "every worker healthy, its model known"
        )

        for model, group in sims.items():
            # An unrelated prompt first; then the conversation goes where the least is cached (the other
            # worker), which only an index that sees this model's blocks can tell.
            before = [s.engine.completed_requests for s in group]
            await _chat(node, model, [{"role": "user", "content": f"unrelated {model} " * 40}])
            first = _served_by(group, before)
            await _indexed(node, model, group[first])

            messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Question 1?"}]
            before = [s.engine.completed_requests for s in group]
            await _chat(node, model, messages)
            second = _served_by(group, before)
            assert second != first, f"{model}: a new prefix went to the worker already holding blocks"
            await _indexed(node, model, group[second])

            messages += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "Question 2?"}]
            before = [s.engine.completed_requests for s in group]
            answer = await _chat(node, model, messages)
            assert _served_by(group, before) == second, f"{model}: the follow-up left its cached prefix"
            assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] >= 300

        assert pool.kv_indexes is not None
        stats = {model: index.stats() for model, index in pool.kv_indexes.items()}
        assert stats[llama3_model_dir.name].block_size == 16
        assert stats[deepseek_model_dir.name].block_size == 32
        assert all(s.orphan_blocks == 0 for s in stats.values()), stats
