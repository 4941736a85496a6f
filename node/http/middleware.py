"""The middleware chain, configured in one place (``middleware_chain``), outermost first:

(outer)          what the composition root puts first: the connection gate
observe          metrics, access log line and server span of every answer (node/telemetry/observe.py;
                 outside errors: it sees the status they made)
errors           maps every exception to the route's API error envelope, never a traceback
request context  request id, identity, tenant claim (checked where a route reads it), routing key:
                 made once here, read by every stage (context_of)

(inner)          authentication and limits (node/http/auth_middleware.py, limits_middleware.py): inside
                 the errors, so a 401/403/429 leaves in the route's envelope with its headers, and before
                 the context, whose tenant and identity come from the verified credential
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence

from aiohttp import web
from aiohttp.typedefs import Middleware
from aiohttp.web_urldispatcher import AbstractRoute

from node.errors import GatewayError
from node.http.auth_middleware import IDENTITY
from node.http.envelopes import OPENAI, EdgeError, ErrorEnvelope
from node.http.ids import random_hex
from node.http.tenancy import ApiConfig, tenant_claim
from node.pipeline.context import RequestContext
from node.telemetry import record

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

REQUEST_ID_HEADER = "X-Request-Id"
# A client's request id is echoed in headers and logs: bounded, and only characters safe in both.
MAX_REQUEST_ID_CHARS = 128
_REQUEST_ID = re.compile(rf"[A-Za-z0-9._:@/+=-]{{1,{MAX_REQUEST_ID_CHARS}}}")

CONTEXT_KEY = web.RequestKey("smg_request_context", RequestContext)


def context_of(request: web.Request) -> RequestContext:
    """The request's context (the request-context middleware made it). Raises KeyError outside the chain."""
    return request[CONTEXT_KEY]


def request_context(*, tenancy: ApiConfig, routing_key_header: str) -> Middleware:
    @web.middleware
    async def make_context(request: web.Request, handler: Handler) -> web.StreamResponse:
        given = request.headers.get(REQUEST_ID_HEADER)
        rid = given if given is not None and _REQUEST_ID.fullmatch(given) else random_hex()
        request[CONTEXT_KEY] = RequestContext(
            request_id=rid,
            routing_key=request.headers.get(routing_key_header),
            headers=request.headers,
            identity=request.get(IDENTITY),
            tenant_claim=tenant_claim(request, tenancy),
            span=record.current().span,  # the observe middleware's server span (INVALID_SPAN: not traced)
        )
        return await handler(request)

    return make_context


def request_identity(request: web.Request) -> tuple[str, str]:
    """(request id, tenant) once the chain ran (the observe middleware reads them on the way out); empty
    strings for a request refused before its context was made."""
    ctx = request.get(CONTEXT_KEY)
    if ctx is None:
        return "", ""
    try:
        tenant = ctx.tenant
    except GatewayError:  # a tenant header no store accepts: the request failed on it, the log names none
        tenant = ""
    return ctx.request_id, tenant


async def echo_request_id(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: every answer, streamed or not, error or not, names its request id."""
    ctx = request.get(CONTEXT_KEY)
    if ctx is not None:
        response.headers[REQUEST_ID_HEADER] = ctx.request_id


def errors(envelopes: Mapping[AbstractRoute, ErrorEnvelope]) -> Middleware:
    """Every failure leaves in the envelope of the adapter owning the route (OpenAI's for the others)."""

    @web.middleware
    async def map_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except GatewayError as exc:
            error = EdgeError.of(exc)
            headers: dict[str, str] = dict(exc.headers)  # WWW-Authenticate, Retry-After, x-ratelimit-*
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            message = exc.text if exc.status != 404 else f"Invalid URL ({request.method} {request.path})"
            code = "not_found" if exc.status == 404 else None
            error = EdgeError(exc.status, message or exc.reason, "invalid_request_error", code=code)
            headers = {k: v for k, v in exc.headers.items() if k.lower() == "allow"}
        except Exception:
            ctx = request.get(CONTEXT_KEY)
            log.exception(
                "unhandled error on %s %s (request %s)",
                request.method,
                request.path,
                ctx.request_id if ctx is not None else "-",
            )
            error = EdgeError(500, "The server had an error while processing your request.", "server_error")
            headers = {}
        ctx = request.get(CONTEXT_KEY)  # made on the way in, even for a request refused there
        if ctx is not None:
            error = dataclasses.replace(error, request_id=ctx.request_id)
        envelope = envelopes.get(request.match_info.route, OPENAI)
        return web.Response(
            status=envelope.status(error), body=envelope.body(error), content_type="application/json", headers=headers
        )

    return map_errors


def middleware_chain(
    *,
    outer: Sequence[Middleware] = (),
    metrics: Middleware,
    envelopes: Mapping[AbstractRoute, ErrorEnvelope],
    tenancy: ApiConfig,
    routing_key_header: str,
    inner: Sequence[Middleware] = (),
) -> list[Middleware]:
    """The chain, outermost first (see the module docstring); ``outer`` go before all of it (the connection
    gate, node/http/connections.py, which must see every request first)."""
    return [
        *outer,
        metrics,
        errors(envelopes),
        *inner,
        request_context(tenancy=tenancy, routing_key_header=routing_key_header),
    ]
