"""The outermost HTTP middleware: every request gets a record (node/telemetry/record.py), a server span when
traced, and on its end the metrics, the access log line and the span's closing attributes.

Outermost so it sees the status the error middleware produced and times the whole answer, a stream included.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware
from opentelemetry.trace import INVALID_SPAN, Span, SpanKind, Status, StatusCode

from node.metrics import NodeMetrics
from node.telemetry import access_log, tracing
from node.telemetry.record import NO_TRACER, RequestRecord, bind
from node.telemetry.tracing import Tracing

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
#: What the record learns of a request once the inner middlewares ran: (request id, tenant).
RequestIdentity = Callable[[web.Request], tuple[str, str]]

# Route patterns are the label, never raw paths: a client cannot blow up the label cardinality.
UNMATCHED_ROUTE = "unmatched"
#: Status of a request whose client went away before an answer (nginx's convention).
CLIENT_CLOSED = 499


def _no_identity(request: web.Request) -> tuple[str, str]:
    return "", ""


def observe(
    metrics: NodeMetrics,
    *,
    tracing_: Tracing | None = None,
    access_log_on: bool = True,
    identity: RequestIdentity = _no_identity,
) -> Middleware:
    tracer = tracing_.tracer if tracing_ is not None else NO_TRACER

    @web.middleware
    async def observed(request: web.Request, handler: Handler) -> web.StreamResponse:
        info = request.match_info.route.resource
        route = info.canonical if info is not None else UNMATCHED_ROUTE
        rec = RequestRecord(method=request.method, route=route, tracer=tracer)
        status = CLIENT_CLOSED
        spanning: contextlib.AbstractContextManager[Span] = (
            tracer.start_as_current_span(
                f"{request.method} {route}",
                context=tracing.extract(request.headers),
                kind=SpanKind.SERVER,
                attributes={"http.request.method": request.method, "http.route": route},
            )
            if tracing_ is not None
            else contextlib.nullcontext(INVALID_SPAN)
        )
        metrics.in_flight.inc()
        metrics.tally.in_flight += 1
        try:
            with spanning as span, bind(rec):
                rec.span = span
                try:
                    resp = await handler(request)
                    status = resp.status
                    return resp
                finally:
                    rec.request_id, rec.tenant = identity(request)
                    if span.is_recording():
                        _close_span(span, rec, status)
        finally:
            metrics.in_flight.dec()
            metrics.tally.in_flight -= 1
            duration = time.perf_counter() - rec.started
            metrics.observe(rec, status, duration)
            if access_log_on:
                access_log.write(rec, path=request.raw_path, status=status, duration_s=duration)

    return observed


def _close_span(span: Span, rec: RequestRecord, status: int) -> None:
    span.set_attribute("http.response.status_code", status)
    if rec.request_id:
        span.set_attribute("smg.request_id", rec.request_id)
    if rec.tenant:
        span.set_attribute("smg.tenant", rec.tenant)
    if rec.model:
        span.set_attribute("gen_ai.request.model", rec.model)
    if rec.worker:
        span.set_attribute("smg.worker", rec.worker)
    if rec.prompt_tokens or rec.completion_tokens:
        span.set_attribute("gen_ai.usage.input_tokens", rec.prompt_tokens)
        span.set_attribute("gen_ai.usage.output_tokens", rec.completion_tokens)
    if status >= 500:
        span.set_status(Status(StatusCode.ERROR))
