"""Structured output end to end against the simulated engine: each API's constraint reaches the worker (on both
Generate transports) and the answer satisfies it; one no engine can apply is a 400 that reaches no worker."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from node.pipeline.parsers.registry import build_parser
from node.structured.constraint import Constraint
from node.workers.types import SamplingParams, WorkerRequest
from node.workers.vllm_grpc import VllmGrpcClient
from tests.http.conftest import Cluster, start_cluster
from tests.pipeline.parsers._run import calls, run
from tests.sim._schema_check import errors

pytestmark = pytest.mark.asyncio(loop_scope="module")

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 10},
        "unit": {"enum": ["c", "f"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "unit", "days"],
    "additionalProperties": False,
}
USER = [{"role": "user", "content": "Weather in Paris for three days?"}]
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}},
    {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {}}}},
]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def sim_cluster(llama3_model_dir: Path) -> AsyncIterator[Cluster]:
    async with start_cluster(llama3_model_dir, workers=1) as c:
        yield c


async def _post(cluster: Cluster, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, http.post(cluster.node.url + path, json=body) as resp:
        return resp.status, await resp.json()


async def _chat(cluster: Cluster, seed: int = 1, **extra: Any) -> str:
    body = {"model": cluster.model, "messages": USER, "max_tokens": 400, "seed": seed, **extra}
    status, reply = await _post(cluster, "/v1/chat/completions", body)
    assert status == 200, reply
    assert reply["choices"][0]["finish_reason"] == "stop"
    return str(reply["choices"][0]["message"]["content"])


async def test_chat_response_format_json_schema_is_satisfied(sim_cluster: Cluster) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "weather", "schema": SCHEMA, "strict": True}}
    for seed in range(5):
        assert errors(json.loads(await _chat(sim_cluster, seed, response_format=fmt)), SCHEMA) == []
    assert isinstance(json.loads(await _chat(sim_cluster, response_format={"type": "json_object"})), dict)
    stream = await sim_cluster.client.chat.completions.create(
        model=sim_cluster.model,
        messages=USER,
        stream=True,
        response_format=fmt,
        seed=3,  # type: ignore[arg-type]
    )
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert errors(json.loads(text), SCHEMA) == []


async def test_vllm_constraints_are_satisfied_on_chat_and_completions(sim_cluster: Cluster) -> None:
    assert re.fullmatch("[0-9]{3}", await _chat(sim_cluster, structured_outputs={"regex": "[0-9]{3}"}))
    assert await _chat(sim_cluster, structured_outputs={"choice": ["red", "blue"]}) in ("red", "blue")
    assert await _chat(sim_cluster, guided_grammar='root ::= "yes" | "no"') in ("yes", "no")
    body = {"model": sim_cluster.model, "prompt": "Code:", "max_tokens": 50, "guided_regex": "[A-Z]{2}-[0-9]{4}"}
    status, reply = await _post(sim_cluster, "/v1/completions", body)
    assert status == 200 and re.fullmatch("[A-Z]{2}-[0-9]{4}", reply["choices"][0]["text"]), reply


async def _calls(cluster: Cluster, seed: int = 1, **extra: Any) -> tuple[str, list[tuple[str, str]], Any]:
    """finish_reason, the (name, arguments) tool calls and the content of a chat answer."""
    body = {"model": cluster.model, "messages": USER, "max_tokens": 400, "seed": seed, **extra}
    status, reply = await _post(cluster, "/v1/chat/completions", body)
    assert status == 200, reply
    choice = reply["choices"][0]
    found = [(c["function"]["name"], c["function"]["arguments"]) for c in choice["message"].get("tool_calls") or ()]
    return choice["finish_reason"], found, choice["message"]["content"]


async def test_named_tool_choice_answers_with_the_functions_arguments(sim_cluster: Cluster) -> None:
    choice = {"type": "function", "function": {"name": "get_weather"}}
    reason, found, content = await _calls(sim_cluster, tools=TOOLS, tool_choice=choice)
    assert reason == "tool_calls" and content is None and [name for name, _ in found] == ["get_weather"]
    assert errors(json.loads(found[0][1]), SCHEMA) == []
    reason, required, content = await _calls(sim_cluster, tools=TOOLS, tool_choice="required")
    assert reason == "tool_calls" and content is None
    assert required and {name for name, _ in required} <= {"get_weather", "search"}


async def test_responses_text_format_is_satisfied_and_echoed(sim_cluster: Cluster) -> None:
    text = {"format": {"type": "json_schema", "name": "weather", "schema": SCHEMA, "strict": True}}
    body = {"model": sim_cluster.model, "input": "Weather?", "text": text, "store": False, "max_output_tokens": 300}
    status, reply = await _post(sim_cluster, "/v1/responses", body)
    assert status == 200, reply
    assert reply["text"] == text
    out = reply["output"][0]["content"][0]["text"]
    assert errors(json.loads(out), SCHEMA) == []


async def test_auto_tool_choice_gets_calls_in_the_llama3_format(sim_cluster: Cluster) -> None:
    found = 0
    for seed in range(8):
        reason, parsed, content = await _calls(sim_cluster, seed, tools=TOOLS)
        for name, arguments in parsed:
            assert name in ("get_weather", "search")
            if name == "get_weather":
                assert errors(json.loads(arguments), SCHEMA) == []
        assert reason == ("tool_calls" if parsed else "stop")
        assert not parsed or not calls(run(build_parser(tool_parser="llama3_json"), [content or ""]))
        found += bool(parsed)
    assert 0 < found < 8, "mostly calls, sometimes text under auto"
    for seed in range(4):
        content = await _chat(sim_cluster, seed, tools=TOOLS, tool_choice="none")
        assert not calls(run(build_parser(tool_parser="llama3_json"), [content])), "none: tools are not offered"


@pytest.mark.parametrize("transport", ["h2", "grpc"])
async def test_the_constraint_travels_on_both_generate_transports(sim_cluster: Cluster, transport: str) -> None:
    client = VllmGrpcClient(f"grpc://{sim_cluster.sims[0].address}", generate_transport=transport)  # type: ignore[arg-type]
    tokenizer = sim_cluster.node.model.tokenizer
    try:
        for constraint, pattern in (
            (Constraint("regex", "[a-c]{4}"), "[a-c]{4}"),
            (Constraint("choice", choices=("zz",)), "zz"),
        ):
            params = SamplingParams(max_tokens=50, constraint=constraint)
            request = WorkerRequest(f"t-{transport}-{pattern}", tokenizer.encode("hi", add_special_tokens=True), params)
            ids = [i for out in [o async for o in client.generate(request)] for i in out.token_ids]
            text = tokenizer.decode(ids, skip_special_tokens=True)
            assert re.fullmatch(pattern, text), (transport, text)
    finally:
        await client.close()


@pytest.mark.parametrize(
    ("path", "extra", "param"),
    [
        ("/v1/chat/completions", {"response_format": {"type": "yaml"}}, "response_format.type"),
        ("/v1/chat/completions", {"structured_outputs": {"regex": "(x)\\1"}}, "structured_outputs.regex"),
        ("/v1/chat/completions", {"tool_choice": {"type": "function", "function": {"name": "x"}}}, "tool_choice"),
        ("/v1/completions", {"guided_choice": []}, "guided_choice"),
        (
            "/v1/responses",
            {"text": {"format": {"type": "json_schema", "schema": {"type": 5}}}},
            "text.format.schema.type",
        ),
    ],
)
async def test_a_constraint_no_engine_can_apply_is_a_400_that_reaches_no_worker(
    sim_cluster: Cluster, path: str, extra: dict[str, Any], param: str
) -> None:
    engine = sim_cluster.sims[0].engine
    before = engine.completed_requests + engine.cancelled_requests
    body: dict[str, Any] = {"model": sim_cluster.model, "max_tokens": 5, "tools": TOOLS, **extra}
    if path == "/v1/completions":
        body = {k: v for k, v in body.items() if k != "tools"} | {"prompt": "x"}
    elif path == "/v1/responses":
        body = {k: v for k, v in body.items() if k not in ("tools", "max_tokens")} | {"input": "x", "store": False}
    else:
        body["messages"] = USER
    status, reply = await _post(sim_cluster, path, body)
    assert status == 400, reply
    assert reply["error"]["type"] == "invalid_request_error" and reply["error"]["param"] == param, reply
    assert engine.completed_requests + engine.cancelled_requests == before
