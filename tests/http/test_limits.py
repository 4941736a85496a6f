"""Every request bound is a 400/413/415 in OpenAI's envelope naming the field and the limit; malformed bodies
and aiohttp's own rejections too (each of these was a 500 with a traceback, or plain text, before)."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import io
import json
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from node.app import run_node
from node.config import RequestLimits
from node.configload import ConfigError, build
from node.sim.worker import SimWorker
from tests.http.conftest import Cluster, fast_sim, node_config

pytestmark = pytest.mark.asyncio(loop_scope="module")

CHAT = {"model": "llama3", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": CHAT,
    "/v1/completions": {"model": "llama3", "prompt": "hi", "max_tokens": 2},
    "/v1/responses": {"model": "llama3", "input": "hi", "max_output_tokens": 2},
    "/v1/conversations": {"items": [{"type": "message", "role": "user", "content": "hi"}]},
}


async def _post(
    url: str, body: bytes | dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    data = io.BytesIO(body if isinstance(body, bytes) else json.dumps(body).encode())
    async with (
        aiohttp.ClientSession(auto_decompress=False) as session,
        session.post(url, data=data, headers={"Content-Type": "application/json", **(headers or {})}) as resp,
    ):
        return resp.status, json.loads(await resp.read())


def _error(body: dict[str, Any], *, param: str | None = None, code: str | None = None) -> str:
    err = body["error"]
    assert set(err) - {"request_id"} == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error"
    if param is not None:
        assert err["param"] == param
    if code is not None:
        assert err["code"] == code
    return str(err["message"])


# --- malformed bodies, on every POST endpoint ---------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(BODIES))
async def test_invalid_utf8_and_deep_json_are_400s(cluster: Cluster, path: str) -> None:
    url = cluster.node.url + path
    raw = json.dumps(BODIES[path]).encode().replace(b'"hi"', b'"h\xff\xfei"')
    status, body = await _post(url, raw)
    assert status == 400 and "UTF-8" in _error(body)
    deep = json.dumps(BODIES[path]).encode().replace(b'"hi"', b"[" * 100_000 + b"]" * 100_000)
    status, body = await _post(url, deep)
    assert status == 400 and _error(body)  # too deep (or, where the schema expects no list there, the wrong type)


@pytest.mark.parametrize(
    ("path", "field", "value"),
    [
        ("/v1/chat/completions", "top_k", 2**32),
        ("/v1/chat/completions", "max_tokens", 2**32),
        ("/v1/chat/completions", "min_tokens", 2**40),
        ("/v1/chat/completions", "n", 2**32),
        ("/v1/chat/completions", "top_logprobs", 2**31),
        ("/v1/chat/completions", "stop_token_ids", [2**32]),
        ("/v1/completions", "logprobs", 2**31),
        ("/v1/completions", "top_k", 2**63),
        ("/v1/responses", "max_output_tokens", 2**32),
        ("/v1/responses", "top_k", 2**32),
    ],
)
async def test_integers_past_the_engine_wire_range_are_400s_naming_the_field(
    cluster: Cluster, path: str, field: str, value: object
) -> None:
    status, body = await _post(cluster.node.url + path, {**BODIES[path], field: value})
    assert status == 400
    assert _error(body)  # names the field (the path for list items)
    assert body["error"]["param"] in (field, f"{field}[0]")


# --- the configured limits --------------------------------------------------------------------------------

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


def _nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.mark.parametrize(
    ("path", "fields", "param", "code"),
    [
        ("/v1/chat/completions", {"n": 129}, "n", "max_n"),
        ("/v1/chat/completions", {"n": 64, "max_tokens": 100_000}, "max_tokens", "max_output_tokens_total"),
        ("/v1/chat/completions", {"logprobs": True, "max_completion_tokens": 200_000}, "max_completion_tokens", None),
        ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs", "max_top_logprobs"),
        ("/v1/chat/completions", {"stop": "x" * 1_000_000}, "stop", "max_stop_chars"),
        ("/v1/chat/completions", {"stop": ["y" * 3000], "n": 64}, "stop[0]", "max_stop_chars"),
        ("/v1/chat/completions", {"stop": [str(i) for i in range(65)]}, "stop", "max_stop_strings"),
        ("/v1/chat/completions", {"stop": ["z" * 1000] * 9}, "stop", "max_stop_chars_total"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}] * 4097}, "messages", "max_messages"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}] * 513}]},
            "messages[0].content",
            "max_content_parts",
        ),
        ("/v1/chat/completions", {"tools": [TOOL] * 129}, "tools", "max_tools"),
        (
            "/v1/chat/completions",
            {"tools": [{"type": "function", "function": {"name": "f", "description": "d" * (1 << 20)}}]},
            "tools",
            "max_tools_bytes",
        ),
        (
            "/v1/chat/completions",
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": _nested(70)}}]},
            "tools",
            "max_json_depth",
        ),
        ("/v1/completions", {"prompt": ["a"] * 65}, "prompt", "max_prompts"),
        ("/v1/completions", {"prompt": ["a"] * 64, "n": 128, "max_tokens": 200}, "max_tokens", None),
        ("/v1/completions", {"logprobs": 21}, "logprobs", "max_top_logprobs"),
        ("/v1/responses", {"input": [{"role": "user", "content": "a"}] * 4097}, "input", "max_messages"),
        ("/v1/responses", {"tools": [{"type": "function", "name": "f"}] * 129}, "tools", "max_tools"),
        ("/v1/conversations", {"items": json.loads("[" * 70 + "]" * 70)}, "items", "max_json_depth"),
    ],
)
async def test_each_limit_is_a_400_naming_field_and_limit(
    cluster: Cluster, path: str, fields: dict[str, Any], param: str, code: str | None
) -> None:
    status, body = await _post(cluster.node.url + path, {**BODIES[path], **fields})
    assert status == 400
    message = _error(body, param=param, code=code)
    assert "limit" in message and (code is None or code in message)


# --- compressed bodies --------------------------------------------------------------------------------------


async def test_compressed_bodies_are_inflated_within_the_limit(cluster: Cluster) -> None:
    url = cluster.node.url + "/v1/chat/completions"
    status, body = await _post(url, gzip.compress(json.dumps(CHAT).encode()), {"Content-Encoding": "gzip"})
    assert status == 200 and body["choices"]
    # 17 MB of JSON inflating past the 16 MB body limit, from a 17 KB body.
    big = {**CHAT, "messages": [{"role": "user", "content": " " * (17 << 20)}]}
    status, body = await _post(url, gzip.compress(json.dumps(big).encode()), {"Content-Encoding": "gzip"})
    assert status == 413 and _error(body, code="request_too_large")
    status, body = await _post(url, json.dumps(CHAT).encode(), {"Content-Encoding": "gzip"})  # not gzip at all
    assert status == 400 and "gzip" in _error(body)
    status, body = await _post(url, json.dumps(CHAT).encode(), {"Content-Encoding": "br"})
    assert status == 415 and _error(body, code="unsupported_content_encoding")


# --- aiohttp's own rejections ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        b"GARBAGE / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /health HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * 9000 + b"\r\n\r\n",
        b"GET /health HTTP/1.1\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(200)) + b"\r\n",
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    ],
    ids=["bad-method", "long-request-line", "long-header", "too-many-headers", "bad-content-length"],
)
async def test_aiohttp_rejections_answer_in_the_envelope(cluster: Cluster, raw: bytes) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", cluster.node.port)
    try:
        writer.write(raw)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), timeout=5)
    finally:
        writer.close()
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.split(b" ", 2)[1] == b"400"
    assert b"application/json" in head
    assert _error(json.loads(payload))


# --- configuration ------------------------------------------------------------------------------------------


async def test_limits_are_config_with_validated_values() -> None:
    limits = build(RequestLimits, args=None, env={"SMG_NODE_MAX_N": "8"}, file_values={}, overrides={})
    assert limits.max_n == 8 and limits.max_tools == RequestLimits().max_tools
    with pytest.raises((ConfigError, ValueError), match="max_n"):
        RequestLimits(max_n=0)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def small_limits(llama3_model_dir: Path) -> AsyncIterator[str]:
    async with contextlib.AsyncExitStack() as stack:
        sim = await stack.enter_async_context(SimWorker(fast_sim(llama3_model_dir)))
        config = replace(
            node_config(llama3_model_dir, [sim.port]),
            limits=RequestLimits(max_n=4, max_output_tokens_total=24, max_messages=2),
        )
        node = await stack.enter_async_context(run_node(config))
        yield node.url


async def test_configured_limits_apply_and_cap_an_omitted_max_tokens(small_limits: str) -> None:
    url = small_limits + "/v1/chat/completions"
    status, body = await _post(url, {**CHAT, "n": 5})
    assert status == 400 and "4" in _error(body, param="n", code="max_n")
    status, body = await _post(url, {**CHAT, "messages": CHAT["messages"] * 3})
    assert status == 400 and _error(body, param="messages", code="max_messages")
    # No max_tokens: the context would allow thousands; the 24-token total caps each of 4 choices at 6.
    status, body = await _post(url, {"model": "llama3", "messages": CHAT["messages"], "n": 4, "ignore_eos": True})
    assert status == 200
    assert body["usage"]["completion_tokens"] == 24
    assert {c["finish_reason"] for c in body["choices"]} == {"length"}
