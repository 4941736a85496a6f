"""Prefill/decode disaggregation end to end: a prefill worker and a decode worker (simulated engines in those
roles) serve one request together, with the prefill's kv_transfer_params handed to the decode."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from pathlib import Path
from typing import Any

import aiohttp

from node.app import run_node
from node.sim.worker import SimWorker
from tests.http.conftest import fast_sim, node_config


async def _call(method: str, url: str, **kw: Any) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s, s.request(method, url, **kw) as r:
        return r.status, await r.json()


async def test_prefill_then_decode_with_the_handed_kv(llama3_model_dir: Path) -> None:
    async with contextlib.AsyncExitStack() as stack:
        prefill = await stack.enter_async_context(SimWorker(fast_sim(llama3_model_dir, role="prefill")))
        decode = await stack.enter_async_context(SimWorker(fast_sim(llama3_model_dir, role="decode")))
        regular = await stack.enter_async_context(SimWorker(fast_sim(llama3_model_dir)))
        config = node_config(llama3_model_dir, [])
        workers = dataclasses.replace(
            config.workers,
            prefill_workers=(f"grpc://127.0.0.1:{prefill.port}",),
            decode_workers=(f"grpc://127.0.0.1:{decode.port}",),
        )
        node = await stack.enter_async_context(run_node(dataclasses.replace(config, workers=workers)))
        model = node.model.name
        body = {"model": model, "messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 12}
        status, pd_answer = await _call("POST", node.url + "/v1/chat/completions", json=body)
        assert status == 200, pd_answer
        assert prefill.engine.completed_requests == 1 and decode.engine.completed_requests == 1
        (handed,) = decode.engine.remote_prefills
        assert handed["remote_engine_id"] == prefill.engine.engine_id and handed["do_remote_prefill"] is True
        usage = pd_answer["usage"]
        assert usage["completion_tokens"] == 12 and usage["prompt_tokens"] > 0

        # Streaming goes the same way.
        async with (
            aiohttp.ClientSession() as s,
            s.post(node.url + "/v1/chat/completions", json={**body, "stream": True}) as r,
        ):
            assert r.status == 200
            raw = (await r.read()).decode()
        text = "".join(
            (json.loads(line[6:])["choices"] or [{}])[0].get("delta", {}).get("content") or ""
            for line in raw.splitlines()
            if line.startswith("data: {")
        )
        assert text == pd_answer["choices"][0]["message"]["content"], "PD streaming and non-streaming disagree"
        assert decode.engine.completed_requests == 2

        # The same prompt on a regular worker gives the same answer (the engine never sees text).
        status, _ = await _call("POST", node.url + "/workers", json={"url": f"grpc://127.0.0.1:{regular.port}"})
        assert status == 201
        _, listing = await _call("GET", node.url + "/workers")
        assert {w["role"] for w in listing["data"]} == {"prefill", "decode", "regular"}

        # Without a decode worker in rotation, the regular pool serves.
        decode_id = next(w["id"] for w in listing["data"] if w["role"] == "decode")
        assert (await _call("DELETE", f"{node.url}/workers/{decode_id}"))[0] == 200
        for _ in range(50):
            status, regular_answer = await _call("POST", node.url + "/v1/chat/completions", json=body)
            if status == 200:
                break
            assert status == 503, regular_answer  # until its first health check passes
            await asyncio.sleep(0.1)
        assert status == 200
        assert regular.engine.completed_requests >= 1
        assert regular_answer["choices"][0]["message"]["content"] == pd_answer["choices"][0]["message"]["content"]
