"""The health checks' unary calls (HealthCheck, GetLoads): through the client (grpc.aio carries them while
``node.workers.vllm_grpc._CHECKS_OVER_H2`` is off) and over our own HTTP/2 connection's unary call directly."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from smg_grpc_proto.generated import vllm_engine_pb2 as pb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as pb_grpc

from node.errors import WorkerFailed
from node.sim import SimWorker, SimWorkerConfig
from node.workers.vllm_grpc import VllmGrpcClient


@pytest.fixture
async def worker(llama3_model_dir: Path) -> AsyncIterator[SimWorker]:
    async with SimWorker(SimWorkerConfig(model_path=str(llama3_model_dir), port=0)) as running:
        yield running


async def test_health_and_loads_over_h2_answer_as_over_grpc_aio(worker: SimWorker) -> None:
    h2 = VllmGrpcClient(f"grpc://{worker.address}", generate_transport="h2")
    aio = VllmGrpcClient(f"grpc://{worker.address}", generate_transport="grpc")
    try:
        assert await h2.health(timeout_s=2.0) is True
        assert await aio.health(timeout_s=2.0) is True
        assert await h2.loads(timeout_s=2.0) == await aio.loads(timeout_s=2.0)
        # Many checks share the one connection (no connection per call).
        assert all(await asyncio.gather(*(h2.health(timeout_s=2.0) for _ in range(50))))
        # The h2 connection's own unary call answers as grpc.aio does.
        ep = await h2._endpoint()
        assert ep.h2 is not None
        raw = await ep.h2.unary("/vllm.grpc.engine.VllmEngine/HealthCheck", b"", timeout_s=2.0)
        assert pb.HealthCheckResponse.FromString(raw).healthy is True
    finally:
        await h2.close()
        await aio.close()


async def test_a_worker_that_accepts_but_never_answers_fails_within_the_timeout() -> None:
    # A hung worker (SIGSTOPped, wedged): the TCP handshake completes in the kernel, nothing ever comes back.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        c = VllmGrpcClient(f"grpc://127.0.0.1:{listener.getsockname()[1]}", generate_transport="h2")
        started = time.monotonic()
        assert await c.health(timeout_s=0.3) is False
        with pytest.raises(WorkerFailed) as caught:
            await c.loads(timeout_s=0.3)
        assert time.monotonic() - started < 2.0
        assert "GetLoads failed: DEADLINE_EXCEEDED" in caught.value.message
        await c.close()


class _NoLoads(pb_grpc.VllmEngineServicer):  # type: ignore[misc]  # generated, untyped
    """A worker that predates GetLoads: healthy, GetLoads unimplemented."""

    async def HealthCheck(self, request: Any, context: Any) -> Any:
        return pb.HealthCheckResponse(healthy=True, message="Health")

    async def GetLoads(self, request: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "no GetLoads here")


async def test_a_worker_without_get_loads_reports_no_load_rather_than_failing() -> None:
    server = grpc.aio.server()
    pb_grpc.add_VllmEngineServicer_to_server(_NoLoads(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    c = VllmGrpcClient(f"grpc://127.0.0.1:{port}", generate_transport="h2")
    try:
        assert await c.health(timeout_s=2.0) is True
        assert await c.loads(timeout_s=2.0) is None
    finally:
        await c.close()
        await server.stop(None)
