"""The HTTP edge over in-memory workers (no gRPC): adapters, their error envelopes, the request context."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
import pytest_asyncio
from aiohttp import web

from node.errors import InvalidRequest
from node.http.adapter import AdapterEnv, AdapterFactory, Route
from node.http.adapters import ADAPTERS
from node.http.envelopes import EdgeError
from node.http.errors import read_json
from node.http.middleware import MAX_REQUEST_ID_CHARS, REQUEST_ID_HEADER, context_of
from node.http.server import build_app
from node.http.tenancy import ApiConfig
from node.metrics import NodeMetrics
from node.pipeline.cpu import CpuPool
from node.pipeline.served_model import ServedModel, load_served_model
from node.tasks import Supervisor
from node.workers.memory import MemoryWorker, memory_pool
from storage.memory import memory_stores

ANSWER = " A fox, quick and brown."


class _Body(msgspec.Struct):
    text: str


class _ToyEnvelope:
    """Anthropic's shape: {"type": "error", "error": {"type", "message"}}."""

    def status(self, error: EdgeError) -> int:
        return error.status

    def body(self, error: EdgeError) -> bytes:
        return msgspec.json.encode({"type": "error", "error": {"type": error.error_type, "message": error.message}})


class ToyAdapter:
    """An adapter of another API: one module and one list entry would add it for real."""

    envelope = _ToyEnvelope()

    def __init__(self, env: AdapterEnv) -> None:
        self._max_body = env.max_body_bytes

    def routes(self) -> Sequence[Route]:
        return [Route("POST", "/v1/toy", self.handle)]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await read_json(request, _Body, self._max_body)
        if not body.text:
            raise InvalidRequest("'text' must not be empty.", param="text")
        return web.json_response({"request_id": context_of(request).request_id})


@dataclass
class Edge:
    url: str
    http: aiohttp.ClientSession
    worker: MemoryWorker
    model: ServedModel


@pytest.fixture(scope="module")
def model(llama3_model_dir: Path) -> ServedModel:
    return load_served_model(str(llama3_model_dir), served_name="llama3")


@pytest_asyncio.fixture
async def edge(model: ServedModel) -> AsyncIterator[Edge]:
    ids = model.tokenizer.encode(ANSWER, add_special_tokens=False)
    worker = MemoryWorker("grpc://mem:1", reply=lambda r: [ids] * r.params.n, chunk_tokens=2)
    cpu = CpuPool(threads=1)
    adapters: tuple[AdapterFactory, ...] = (*ADAPTERS, ToyAdapter)
    async with Supervisor() as sup:
        pool = memory_pool([worker], supervisor=sup)
        app = build_app(
            models=[model],
            pool=pool,
            cpu=cpu,
            metrics=NodeMetrics(pool),
            max_body_bytes=1 << 16,
            stores=memory_stores(max_items=100, retention_s=60.0),
            tenancy=ApiConfig(),
            adapters=adapters,
        )
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            async with aiohttp.ClientSession() as http:
                yield Edge(f"http://127.0.0.1:{port}", http, worker, model)
        finally:
            await runner.cleanup()
            cpu.close()


def _chat(**kw: object) -> dict[str, Any]:
    return {"model": "llama3", "messages": [{"role": "user", "content": "Describe it."}], **kw}


async def test_a_given_request_id_is_echoed_else_one_is_minted(edge: Edge) -> None:
    async with edge.http.post(
        f"{edge.url}/v1/chat/completions", json=_chat(), headers={REQUEST_ID_HEADER: "abc-123"}
    ) as r:
        assert r.status == 200 and r.headers[REQUEST_ID_HEADER] == "abc-123"
    async with edge.http.post(f"{edge.url}/v1/chat/completions", json=_chat(stream=True)) as r:
        await r.read()
        minted = r.headers[REQUEST_ID_HEADER]
    assert len(minted) == 32 and int(minted, 16) >= 0, "a streamed answer names its (minted) request id too"
    for bad in ("x" * (MAX_REQUEST_ID_CHARS + 1), "two words"):
        async with edge.http.post(f"{edge.url}/v1/toy", json={"text": "hi"}, headers={REQUEST_ID_HEADER: bad}) as r:
            echoed = r.headers[REQUEST_ID_HEADER]
            assert echoed != bad and (await r.json()) == {"request_id": echoed}
    async with edge.http.post(
        f"{edge.url}/v1/chat/completions", json=_chat(model="nope"), headers={REQUEST_ID_HEADER: "e-1"}
    ) as r:
        assert r.status == 404 and r.headers[REQUEST_ID_HEADER] == "e-1", "errors name the request id as well"


async def test_each_adapter_answers_errors_in_its_own_envelope(edge: Edge) -> None:
    async with edge.http.post(f"{edge.url}/v1/toy", json={"text": ""}) as r:
        assert r.status == 400
        assert await r.json() == {
            "type": "error",
            "error": {"type": "invalid_request_error", "message": "'text' must not be empty."},
        }
    async with edge.http.post(f"{edge.url}/v1/toy", data=b"{not json") as r:
        body = await r.json()
        assert r.status == 400 and body["type"] == "error" and "JSON" in body["error"]["message"]
    async with edge.http.post(f"{edge.url}/v1/chat/completions", json=_chat(temperature=5)) as r:
        body = await r.json()
        assert r.status == 400 and body["error"]["param"] == "temperature", "OpenAI routes keep OpenAI's envelope"
    async with edge.http.get(f"{edge.url}/v1/nowhere") as r:
        assert r.status == 404 and (await r.json())["error"]["code"] == "not_found"
    assert edge.worker.requests == [], "no bad request reached a worker"


async def test_a_streamed_chat_renders_the_pipeline_events(edge: Edge) -> None:
    body = _chat(stream=True, stream_options={"include_usage": True})
    async with edge.http.post(f"{edge.url}/v1/chat/completions", json=body) as r:
        raw = (await r.read()).decode()
    frames = [line.removeprefix("data: ") for line in raw.split("\n\n") if line]
    assert frames[-1] == "[DONE]"
    chunks = [json.loads(f) for f in frames[:-1]]
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert content == ANSWER
    finish = [c["choices"][0] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert finish == [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}]
    usage = chunks[-1]["usage"]
    answer_tokens = len(edge.model.tokenizer.encode(ANSWER, add_special_tokens=False))
    assert usage["completion_tokens"] == answer_tokens
    assert usage["prompt_tokens"] == len(edge.worker.requests[0].prompt_ids)


async def test_a_completions_batch_fans_out_in_the_pipeline(edge: Edge) -> None:
    body = {"model": "llama3", "prompt": ["one", "two"], "n": 2, "max_tokens": 3}
    async with edge.http.post(f"{edge.url}/v1/completions", json=body) as r:
        answer = await r.json()
    assert [c["index"] for c in answer["choices"]] == [0, 1, 2, 3]
    assert {c["finish_reason"] for c in answer["choices"]} == {"length"}
    prompts = sum(len(q.prompt_ids) for q in edge.worker.requests)
    assert answer["usage"]["prompt_tokens"] == prompts and answer["usage"]["completion_tokens"] == 12
