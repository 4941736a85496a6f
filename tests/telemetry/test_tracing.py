"""Traces of real requests through a node: the client's W3C traceparent is followed, the pipeline's spans
(server, template+tokenize, route, generate) form one trace, and the worker receives the generate span's
traceparent as gRPC metadata over both transports. Exported to an in-memory exporter, and once over OTLP/HTTP
to a real local receiver."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gzip
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from node.app import run_node
from node.config import NodeConfig, TelemetryConfig
from node.sim.servicer import SimEngineServicer
from node.sim.worker import SimWorker
from tests.http.conftest import fast_sim, node_config
from tests.procs import free_port

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


@pytest.fixture
def worker_metadata(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, str]]:
    """The metadata of every Generate call the simulated workers receive."""
    seen: list[dict[str, str]] = []
    original = SimEngineServicer.Generate

    async def recording(self: SimEngineServicer, request: Any, context: Any) -> Any:
        seen.append({k: v for k, v in context.invocation_metadata() if isinstance(v, str)})
        async for out in original(self, request, context):
            yield out

    monkeypatch.setattr(SimEngineServicer, "Generate", recording)
    return seen


def _traced(config: NodeConfig, transport: str = "h2", **telemetry: Any) -> NodeConfig:
    workers = dataclasses.replace(config.workers, generate_transport=transport)
    return dataclasses.replace(config, workers=workers, telemetry=TelemetryConfig(trace_sample_ratio=1.0, **telemetry))


async def _chat(url: str, headers: dict[str, str]) -> tuple[int, dict[str, str]]:
    body = {"model": "llama3", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}
    async with aiohttp.ClientSession() as s, s.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
        await r.read()
        return r.status, dict(r.headers)


@pytest.mark.parametrize("transport", ["h2", "grpc"])
async def test_client_trace_is_followed_and_propagated_to_the_worker(
    llama3_model_dir: Path, worker_metadata: list[dict[str, str]], transport: str
) -> None:
    exporter = InMemorySpanExporter()
    async with SimWorker(fast_sim(llama3_model_dir)) as sim:
        config = _traced(node_config(llama3_model_dir, [sim.port]), transport)
        async with run_node(config, span_exporter=exporter) as node:
            headers = {"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01", "X-Request-Id": "req-abc-1"}
            status, _ = await _chat(node.url, headers)
            assert status == 200
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert {"POST /v1/chat/completions", "template+tokenize", "route", "generate"} <= set(spans)
    server = spans["POST /v1/chat/completions"]
    assert all(f"{s.context.trace_id:032x}" == TRACE_ID for s in spans.values()), "one trace, the client's"
    assert server.parent is not None and f"{server.parent.span_id:016x}" == CLIENT_SPAN
    for child in ("template+tokenize", "route", "generate"):
        assert spans[child].parent is not None and spans[child].parent.span_id == server.context.span_id
    attrs = dict(server.attributes or {})
    assert attrs["http.response.status_code"] == 200 and attrs["smg.request_id"] == "req-abc-1"
    assert attrs["gen_ai.request.model"] == "llama3" and attrs["gen_ai.usage.output_tokens"] == 4
    route = dict(spans["route"].attributes or {})
    assert route["smg.worker"] == f"grpc://127.0.0.1:{sim.port}" and route["smg.routing.policy"] == "round_robin"
    assert "chose" in str(route["smg.routing.reason"])
    generate = dict(spans["generate"].attributes or {})
    assert float(generate["gen_ai.server.time_to_first_token"]) > 0 and generate["gen_ai.usage.output_tokens"] == 4
    # The worker got the generate span's context: same trace, the generate span as parent.
    (meta,) = worker_metadata
    gen_ctx = spans["generate"].context
    assert meta["traceparent"] == f"00-{TRACE_ID}-{gen_ctx.span_id:016x}-01"


async def test_off_by_default_and_unsampled_parents_are_not_traced(
    llama3_model_dir: Path, worker_metadata: list[dict[str, str]]
) -> None:
    async with SimWorker(fast_sim(llama3_model_dir)) as sim:
        base = node_config(llama3_model_dir, [sim.port])
        async with run_node(base) as node:  # no tracing configured: nothing traced, nothing propagated
            assert (await _chat(node.url, {"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01"}))[0] == 200
        exporter = InMemorySpanExporter()
        async with run_node(_traced(base), span_exporter=exporter) as node:
            # The client's parent was not sampled: a parent-based sampler follows it.
            assert (await _chat(node.url, {"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-00"}))[0] == 200
    off, unsampled = worker_metadata
    assert "traceparent" not in off
    # The decision travels on (W3C): the worker hears of the trace, flagged not sampled.
    assert unsampled["traceparent"].startswith(f"00-{TRACE_ID}-") and unsampled["traceparent"].endswith("-00")
    assert exporter.get_finished_spans() == ()


@contextlib.asynccontextmanager
async def otlp_receiver() -> AsyncIterator[tuple[str, list[ExportTraceServiceRequest]]]:
    """A real OTLP/HTTP trace receiver (protobuf over POST /v1/traces) on a local port."""
    received: list[ExportTraceServiceRequest] = []

    async def traces(request: web.Request) -> web.Response:
        body = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        received.append(ExportTraceServiceRequest.FromString(body))
        return web.Response(body=b"", content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", traces)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}/v1/traces", received
    finally:
        await runner.cleanup()


async def test_spans_reach_a_real_otlp_http_receiver(llama3_model_dir: Path) -> None:
    async with otlp_receiver() as (endpoint, received), SimWorker(fast_sim(llama3_model_dir)) as sim:
        config = _traced(node_config(llama3_model_dir, [sim.port]), otlp_traces_endpoint=endpoint)
        async with run_node(config) as node:
            status, _ = await _chat(node.url, {"X-Request-Id": "otlp-1"})
            assert status == 200
        # Leaving the node flushed the batch exporter: the spans arrived before run_node returned.
        await asyncio.sleep(0)
    spans = [s for req in received for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]
    names = {s.name for s in spans}
    assert {"POST /v1/chat/completions", "template+tokenize", "route", "generate"} <= names
    services = {
        a.value.string_value for req in received for rs in req.resource_spans for a in rs.resource.attributes
        if a.key == "service.name"
    }  # fmt: skip
    assert services == {"smg-node"}
    assert len({s.trace_id for s in spans}) == 1


def test_the_sdk_is_imported_only_when_tracing_is_on() -> None:
    """Tracing is off by default; its SDK (~0.1 s to import) is then no part of a node's start."""
    import subprocess
    import sys

    code = "import sys, node.cli, node.app; print(sorted(m for m in sys.modules if m.startswith('opentelemetry.sdk')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert done.stdout.strip() == "[]"
