"""The HTTP application: the API adapters' routes (node/http/adapters.py) over one request pipeline, model
listing, liveness and readiness, behind the configured middleware chain (node/http/middleware.py)."""

from __future__ import annotations

import os
from collections.abc import Sequence

import msgspec
from aiohttp import web
from aiohttp.typedefs import Middleware
from aiohttp.web_urldispatcher import AbstractRoute

from node.auth.metering import meter_run
from node.config import RequestLimits
from node.drain import Drain
from node.http.adapter import AdapterEnv, AdapterFactory
from node.http.adapters import ADAPTERS
from node.http.envelopes import ErrorEnvelope
from node.http.errors import NO_AUTO_DECOMPRESS, REQUEST_LIMITS, error_body
from node.http.history import History
from node.http.middleware import echo_request_id, middleware_chain
from node.http.tenancy import ApiConfig
from node.metrics import NodeMetrics
from node.pipeline.cpu import CpuPool
from node.pipeline.pipeline import Pipeline
from node.pipeline.run import Run
from node.pipeline.served_model import ServedModel
from node.pipeline.spec import Prepared
from node.routing.config import DEFAULT_ROUTING_KEY_HEADER
from node.telemetry.observe import observe as observe_middleware
from node.workers.deadlines import DeadlineConfig
from node.workers.pool import WorkerPool
from node.workers.retry import RetryConfig
from storage.base import Stores


def _json(obj: object, status: int = 200) -> web.Response:
    return web.Response(status=status, body=msgspec.json.encode(obj), content_type="application/json")


def _meter(prepared: Prepared, run: Run) -> None:
    """Reserve and meter the run under the request's limits, when it has any."""
    meter_run(prepared.reserve_tokens, lambda: run.usage.prompt_tokens + run.usage.completion_tokens)


def build_app(
    *,
    models: Sequence[ServedModel],
    pool: WorkerPool,
    cpu: CpuPool,
    metrics: NodeMetrics,
    max_body_bytes: int,
    routing_key_header: str = DEFAULT_ROUTING_KEY_HEADER,
    stores: Stores,
    tenancy: ApiConfig,
    adapters: Sequence[AdapterFactory] = ADAPTERS,
    retry: RetryConfig | None = None,
    deadlines: DeadlineConfig | None = None,
    limits: RequestLimits | None = None,
    observe: Middleware | None = None,
    outer_middlewares: Sequence[Middleware] = (),
    drain: Drain | None = None,
    inner_middlewares: Sequence[Middleware] = (),
) -> web.Application:
    """The node's routes. ``drain``: once it is draining, /readiness answers 503 whatever the workers say.
    ``observe`` is the outermost middleware (node/telemetry/observe.py; the default: metrics only).
    ``inner_middlewares`` (authentication, limits) run inside the error middleware, before the request
    context is made (it takes the tenant from their identity)."""
    limits = limits or RequestLimits()
    draining = drain or Drain()
    # Filled as adapters register their routes below; the error middleware reads it per request.
    envelopes: dict[AbstractRoute, ErrorEnvelope] = {}
    chain = middleware_chain(
        outer=outer_middlewares,
        metrics=observe or observe_middleware(metrics, access_log_on=False),
        envelopes=envelopes,
        tenancy=tenancy,
        routing_key_header=routing_key_header,
        inner=inner_middlewares,
    )
    # client_max_size bounds what aiohttp buffers; read_json answers 413 in the API's envelope past it.
    app = web.Application(
        middlewares=chain,
        client_max_size=max_body_bytes + 1,
        handler_args={
            **NO_AUTO_DECOMPRESS,
            "max_line_size": limits.max_request_line_bytes,
            "max_field_size": limits.max_header_bytes,
            "max_headers": limits.max_headers,
        },
    )
    app[REQUEST_LIMITS] = limits
    app.on_response_prepare.append(echo_request_id)
    pipeline = Pipeline(
        models=models,
        pool=pool,
        cpu=cpu,
        limits=limits,
        on_usage=metrics.observe_usage,
        on_admit=_meter,
        retry=retry,
        deadlines=deadlines,
    )
    env = AdapterEnv(pipeline=pipeline, max_body_bytes=max_body_bytes, history=History(stores), tenancy=tenancy)
    for make_adapter in adapters:
        adapter = make_adapter(env)
        for route in adapter.routes():
            envelopes[app.router.add_route(route.method, route.path, route.handler)] = adapter.envelope

    def model_json(model: ServedModel) -> dict[str, object]:
        return {
            "id": model.name,
            "object": "model",
            "created": model.created,
            "owned_by": "smg-node",
            "max_model_len": model.max_context_length,
        }

    async def list_models(request: web.Request) -> web.Response:
        # Only models some worker can serve right now (a regular one, or a prefill and a decode one).
        data = [model_json(m) for m in models if pool.can_serve(m.name)]
        return _json({"object": "list", "data": data})

    async def get_model(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        model = next((m for m in models if m.answers_to(name)), None)
        if model is None:
            return web.Response(
                status=404,
                body=error_body(
                    f"The model '{name}' does not exist",
                    "invalid_request_error",
                    param="model",
                    code="model_not_found",
                ),
                content_type="application/json",
            )
        return _json({"id": model.name, "object": "model", "created": model.created, "owned_by": "smg-node"})

    async def health(request: web.Request) -> web.Response:
        return _json({"status": "ok", "pid": os.getpid()})

    async def readiness(request: web.Request) -> web.Response:
        healthy = pool.healthy()
        ready = pool.can_serve() and not draining.draining
        body = {
            "status": "draining" if draining.draining else "ready" if ready else "not ready",
            "policy": pool.policy_name,
            "healthy_workers": len(healthy),
            "workers": [
                {
                    "url": w.url,
                    "role": w.role,
                    "healthy": w.healthy,
                    "in_flight": w.in_flight,
                    "load": w.load,  # msgspec encodes the dataclass (or null before the first report)
                    "kv_events": w.kv_events,
                    "last_error": w.last_error or None,
                }
                for w in pool.workers
            ],
        }
        return _json(body, status=200 if ready else 503)

    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{name:.+}", get_model)
    app.router.add_get("/health", health)
    app.router.add_get("/readiness", readiness)
    app.router.add_get("/metrics", metrics.handle)
    return app
