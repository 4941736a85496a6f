"""/metrics shows each model's KV-event index (size, memory estimate, evictions, gaps) and the approximate
tree's pages and evictions, per model."""

from __future__ import annotations

import asyncio
import contextlib
import re
from pathlib import Path

import aiohttp

from node.app import run_node
from node.routing.config import RoutingConfig
from node.sim.worker import SimWorker
from tests.http.conftest import fast_sim, node_config


def _value(metrics: str, name: str, labels: str) -> float:
    found = re.search(rf"^{re.escape(name)}\{{{re.escape(labels)}\}} (\S+)$", metrics, re.MULTILINE)
    assert found is not None, f"{name}{{{labels}}} missing from /metrics"
    return float(found.group(1))


async def test_kv_index_and_tree_metrics(llama3_model_dir: Path) -> None:
    async with contextlib.AsyncExitStack() as stack:
        # One worker publishes KV events (the index), one does not (the approximate tree); both bounds tiny.
        publishing = await stack.enter_async_context(SimWorker(fast_sim(llama3_model_dir)))
        silent = await stack.enter_async_context(SimWorker(fast_sim(llama3_model_dir, kv_events=False)))
        routing = RoutingConfig(policy="cache_aware", kv_index_max_blocks=4, tree_max_pages=4)
        node = await stack.enter_async_context(
            run_node(node_config(llama3_model_dir, [publishing.port, silent.port], routing))
        )
        model = node.model.name
        pool = node.pool
        for _ in range(250):
            if all(pool.routable(w) for w in pool.workers):
                break
            await asyncio.sleep(0.02)
        async with aiohttp.ClientSession() as s:
            for k in range(4):
                text = f"Prompt number {k} is long enough to fill several pages of sixteen tokens each. " * 3
                body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 2}
                async with s.post(node.url + "/v1/chat/completions", json=body) as r:
                    assert r.status == 200
                await asyncio.sleep(0.1)  # the publishing worker's events arrive
            assert publishing.engine.completed_requests > 0 and silent.engine.completed_requests > 0
            async with s.get(node.url + "/metrics") as r:
                metrics = await r.text()

        labels = f'model="{model}"'
        assert _value(metrics, "smg_node_kv_index_workers", labels) == 1
        assert 0 < _value(metrics, "smg_node_kv_index_blocks", labels) <= 4
        assert _value(metrics, "smg_node_kv_index_bytes_estimate", labels) > 0
        assert _value(metrics, "smg_node_kv_index_block_size_tokens", labels) == 16
        assert _value(metrics, "smg_node_kv_index_evicted_blocks_total", labels) > 0
        assert _value(metrics, "smg_node_kv_index_gaps_total", labels) == 0
        assert _value(metrics, "smg_node_kv_index_orphan_blocks_total", labels) >= 0
        tree = f'model="{model}",role="regular"'
        assert _value(metrics, "smg_node_approx_tree_pages", tree) == 4
        assert _value(metrics, "smg_node_approx_tree_evicted_pages_total", tree) > 0
