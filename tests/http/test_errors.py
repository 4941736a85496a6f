"""Bad input gets a clear error in OpenAI's envelope, and the node keeps serving."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from node.app import run_node
from node.config import HttpConfig, LogConfig, ModelConfig, NodeConfig, WorkerPoolConfig
from tests.http.conftest import Cluster

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def _post(cluster: Cluster, path: str, body: bytes | dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as session:
        kwargs: dict[str, Any] = (
            {"json": body}
            if isinstance(body, dict)
            else {"data": io.BytesIO(body), "headers": {"Content-Type": "application/json"}}
        )
        async with session.post(cluster.node.url + path, **kwargs) as resp:
            return resp.status, await resp.json()


def _assert_envelope(body: dict[str, Any], *, param: str | None = None, code: str | None = None) -> str:
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code", "request_id"}
    assert isinstance(err["request_id"], str) and err["request_id"], "the body names the request id"
    assert isinstance(err["message"], str) and err["message"]
    assert "Traceback" not in err["message"]
    if param is not None:
        assert err["param"] == param
    if code is not None:
        assert err["code"] == code
    return str(err["message"])


def _chat(cluster: Cluster, **kw: Any) -> dict[str, Any]:
    return {"model": cluster.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **kw}


async def test_malformed_json_is_400(cluster: Cluster) -> None:
    status, body = await _post(cluster, "/v1/chat/completions", b'{"model": "x", "messages": [')
    assert status == 400
    assert "JSON" in _assert_envelope(body)
    assert body["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("patch", "param"),
    [
        ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"max_tokens": "ten"}, "max_tokens"),
        ({"temperature": 7}, "temperature"),
        ({"n": 0}, "n"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"stop": [""]}, "stop"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content[0].type"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"stop_token_ids": [10**9]}, "stop_token_ids"),
    ],
)
async def test_schema_violations_name_the_field(cluster: Cluster, patch: dict[str, Any], param: str) -> None:
    status, body = await _post(cluster, "/v1/chat/completions", _chat(cluster, **patch))
    assert status == 400, body
    _assert_envelope(body, param=param)


async def test_missing_required_field(cluster: Cluster) -> None:
    status, body = await _post(cluster, "/v1/chat/completions", {"model": cluster.model})
    assert status == 400
    _assert_envelope(body, param="messages")


async def test_completions_bad_prompt(cluster: Cluster) -> None:
    for prompt, param in (([1, "a"], "prompt"), ([[]], "prompt[0]"), ([-5], "prompt")):
        status, body = await _post(cluster, "/v1/completions", {"model": cluster.model, "prompt": prompt})
        assert status == 400, body
        _assert_envelope(body, param=param)


async def test_unknown_model_is_404(cluster: Cluster) -> None:
    status, body = await _post(cluster, "/v1/chat/completions", _chat(cluster, model="no-such-model"))
    assert status == 404
    _assert_envelope(body, param="model", code="model_not_found")


async def test_prompt_longer_than_context_is_400(cluster: Cluster) -> None:
    words = " ".join(["hello"] * (cluster.node.model.max_context_length + 10))
    status, body = await _post(
        cluster, "/v1/chat/completions", _chat(cluster, messages=[{"role": "user", "content": words}])
    )
    assert status == 400
    assert "maximum context length" in _assert_envelope(body, code="context_length_exceeded")
    status, body = await _post(
        cluster, "/v1/completions", {"model": cluster.model, "prompt": "hi", "max_tokens": 10**6}
    )
    assert status == 400
    _assert_envelope(body, code="context_length_exceeded")


async def test_body_over_limit_is_413(cluster: Cluster) -> None:
    big = b'{"model": "m", "prompt": "' + b"a" * (16 * 1024 * 1024 + 10) + b'"}'
    status, body = await _post(cluster, "/v1/completions", big)
    assert status == 413
    _assert_envelope(body, code="request_too_large")


async def test_unknown_route_is_404_envelope(cluster: Cluster) -> None:
    status, body = await _post(cluster, "/v1/nope", {})
    assert status == 404
    _assert_envelope(body)


async def test_node_still_serves_after_bad_input(cluster: Cluster) -> None:
    r = await cluster.client.chat.completions.create(
        model=cluster.model, messages=[{"role": "user", "content": "still there?"}], max_tokens=3
    )
    assert r.choices[0].message.content
    async with aiohttp.ClientSession() as session, session.get(cluster.node.url + "/health") as resp:
        assert resp.status == 200


async def test_no_healthy_worker_is_503(llama3_model_dir: Path, unused_tcp_port: int) -> None:
    config = NodeConfig(
        http=HttpConfig(port=0),
        model=ModelConfig(model_path=str(llama3_model_dir), served_model_name="m"),
        workers=WorkerPoolConfig(workers=(f"grpc://127.0.0.1:{unused_tcp_port}",), health_interval_s=0.2),
        log=LogConfig(),
    )
    async with run_node(config) as node, aiohttp.ClientSession() as session:
        async with session.get(node.url + "/readiness") as resp:
            assert resp.status == 503
            assert (await resp.json())["healthy_workers"] == 0
        for stream in (False, True):
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
            async with session.post(node.url + "/v1/chat/completions", json=body) as resp:
                assert resp.status == 503
                _assert_envelope(await resp.json(), code="no_healthy_worker")
        async with session.get(node.url + "/health") as resp:
            assert resp.status == 200
