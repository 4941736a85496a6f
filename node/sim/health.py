"""The standard ``grpc.health.v1.Health`` service, as the reference vLLM server registers it.

SERVING for the whole server ("") and for ``vllm.grpc.engine.VllmEngine`` until shutdown starts, then
NOT_SERVING; any other service name is NOT_FOUND. Written here because the stubs do not type grpcio's own
asyncio servicer.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from node.sim.grpc_server import AnyServer

Context = grpc.aio.ServicerContext[Any, Any]


class HealthService:
    def __init__(self, services: tuple[str, ...]) -> None:
        self._services = frozenset(("", *services))
        self._serving = True
        self._stopped = asyncio.Event()

    def register(self, server: AnyServer) -> None:
        health_pb2_grpc.add_HealthServicer_to_server(self, server)

    def shut_down(self) -> None:
        self._serving = False
        self._stopped.set()

    def _status(self) -> Any:
        response = health_pb2.HealthCheckResponse
        return response.SERVING if self._serving else response.NOT_SERVING

    async def Check(self, request: Any, context: Context) -> Any:
        if request.service not in self._services:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return health_pb2.HealthCheckResponse(status=self._status())

    async def List(self, request: Any, context: Context) -> Any:
        response = health_pb2.HealthListResponse()
        for service in sorted(self._services):
            response.statuses[service].status = self._status()
        return response

    async def Watch(self, request: Any, context: Context) -> AsyncIterator[Any]:
        if request.service not in self._services:
            yield health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVICE_UNKNOWN)
            return
        yield health_pb2.HealthCheckResponse(status=self._status())
        if self._serving:
            await self._stopped.wait()
            yield health_pb2.HealthCheckResponse(status=self._status())
