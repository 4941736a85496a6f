"""Several models on one node: each request goes to the workers of the model it names, /v1/models lists the
models some worker can serve now, an unknown model is a 404 and a known one without workers a 503."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from pathlib import Path
from typing import Any

import aiohttp

from node.app import run_node
from node.cluster.registry import worker_id
from node.config import ModelConfig
from node.sim.worker import SimWorker
from tests.http.conftest import fast_sim, node_config


async def _call(method: str, url: str, **kw: Any) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s, s.request(method, url, **kw) as r:
        return r.status, await r.json()


async def _models(base: str) -> list[str]:
    return [m["id"] for m in (await _call("GET", base + "/v1/models"))[1]["data"]]


async def test_requests_go_to_their_models_workers(llama3_model_dir: Path, deepseek_model_dir: Path) -> None:
    async with contextlib.AsyncExitStack() as stack:
        llama = await stack.enter_async_context(SimWorker(fast_sim(llama3_model_dir)))
        deepseek = await stack.enter_async_context(SimWorker(fast_sim(deepseek_model_dir)))
        config = node_config(llama3_model_dir, [llama.port, deepseek.port])
        config = dataclasses.replace(
            config, model=ModelConfig(model_path=(str(llama3_model_dir), str(deepseek_model_dir)))
        )
        node = await stack.enter_async_context(run_node(config))
        names = (llama3_model_dir.name, deepseek_model_dir.name)

        for _ in range(100):  # until both workers passed a health check and reported their model
            if sorted(await _models(node.url)) == sorted(names):
                break
            await asyncio.sleep(0.05)
        assert sorted(await _models(node.url)) == sorted(names)

        for name, sim in zip(names, (llama, deepseek), strict=True):
            before = sim.engine.completed_requests
            for _ in range(3):
                body = {"model": name, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 5}
                status, answer = await _call("POST", node.url + "/v1/chat/completions", json=body)
                assert status == 200, answer
                assert answer["model"] == name
            assert sim.engine.completed_requests == before + 3, f"{name}'s requests went elsewhere"
        # Completions and Responses route by model too.
        status, _ = await _call(
            "POST", node.url + "/v1/completions", json={"model": names[1], "prompt": "hi", "max_tokens": 3}
        )
        assert status == 200 and deepseek.engine.completed_requests == 4
        status, _ = await _call(
            "POST", node.url + "/v1/responses", json={"model": names[1], "input": "hi", "max_output_tokens": 3}
        )
        assert status == 200 and deepseek.engine.completed_requests == 5

        status, err = await _call(
            "POST",
            node.url + "/v1/chat/completions",
            json={"model": "nope", "messages": [{"role": "user", "content": "x"}]},
        )
        assert status == 404 and err["error"]["code"] == "model_not_found"

        # The deepseek worker goes away: its model leaves the list; asking for it is a 503, not a 404.
        url = f"grpc://127.0.0.1:{deepseek.port}"
        assert (await _call("DELETE", f"{node.url}/workers/{worker_id(url)}"))[0] == 200
        assert await _models(node.url) == [names[0]]
        body = {"model": names[1], "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
        status, err = await _call("POST", node.url + "/v1/chat/completions", json=body)
        assert status == 503, err
        _, listing = await _call("GET", node.url + "/workers")
        assert [w["model"] for w in listing["data"]] == [names[0]]


async def test_each_model_can_have_its_own_policy(llama3_model_dir: Path, deepseek_model_dir: Path) -> None:
    async with contextlib.AsyncExitStack() as stack:
        llamas = [await stack.enter_async_context(SimWorker(fast_sim(llama3_model_dir))) for _ in range(2)]
        deepseeks = [await stack.enter_async_context(SimWorker(fast_sim(deepseek_model_dir))) for _ in range(2)]
        config = node_config(llama3_model_dir, [s.port for s in (*llamas, *deepseeks)])
        config = dataclasses.replace(
            config,
            model=ModelConfig(model_path=(str(llama3_model_dir), str(deepseek_model_dir))),
            routing=dataclasses.replace(config.routing, model_policies=(f"{deepseek_model_dir}=consistent_hashing",)),
        )
        node = await stack.enter_async_context(run_node(config))
        names = (llama3_model_dir.name, deepseek_model_dir.name)
        for _ in range(100):  # until all four passed a health check and reported their model
            listing = (await _call("GET", node.url + "/workers"))[1]["data"]
            if all(w["routable_here"] and w["model"] for w in listing):
                break
            await asyncio.sleep(0.05)
        for name in names:
            for _ in range(6):
                body = {"model": name, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}
                status, _ = await _call(
                    "POST", node.url + "/v1/chat/completions", json=body, headers={"X-SMG-Routing-Key": "user-7"}
                )
                assert status == 200
        assert [s.engine.completed_requests for s in llamas] == [3, 3], "llama3 keeps the default round robin"
        assert sorted(s.engine.completed_requests for s in deepseeks) == [0, 6], "one routing key, one worker"
