"""Limits at the HTTP edge: a keyed request to /v1 is admitted under its key's and its tenant's limits
(node/cluster/limiter.py), refused with 429 (Retry-After and x-ratelimit-*) when one is exhausted, and
settled with its actual tokens when it ends. Every response of a limited identity carries OpenAI's
x-ratelimit-* headers, streams included (set when the response is prepared).

Tokens: admission checks that the window has budget left; once the request is prepared (its prompt tokens
and output budget known, before any worker sees it) the pipeline reserves prompt plus budget through the
request's meter (``ClusterLimiter.reserve``), refusing with 429 when they do not fit; when the request ends,
however it ends, its actual usage is charged and the unused reservation refunded (``settle``).
"""

from __future__ import annotations

from typing import Final

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from node.auth.metering import CURRENT_METER, Meter
from node.cluster.limiter import ClusterLimiter, Refusal, Scope, key_scope, tenant_scope
from node.cluster.tenant_limits import TenantLimits
from node.errors import RateLimited
from node.http.auth_middleware import IDENTITY

RATE_HEADERS: Final = web.RequestKey("smg_rate_headers", dict[str, str])
#: Only the inference and history APIs are limited; admin and status routes never are.
LIMITED_PREFIX: Final = "/v1/"

_MESSAGES: Final = {
    "requests": "Rate limit reached for requests per minute",
    "tokens": "Rate limit reached for tokens per minute",
    "concurrent": "Too many concurrent requests",
    "capacity": "This node cannot count more limited identities right now",
}


def limits_middleware(limiter: ClusterLimiter, tenants: TenantLimits) -> Middleware:
    @web.middleware
    async def limit(request: web.Request, handler: Handler) -> web.StreamResponse:
        if IDENTITY not in request or not request.path.startswith(LIMITED_PREFIX):
            return await handler(request)
        identity = request[IDENTITY]
        scopes = []
        if identity.key_id is not None and identity.limits.any:
            scopes.append(Scope(key_scope(identity.key_id), identity.limits))
        tenant = tenants.get(identity.tenant)
        if tenant is not None:
            scopes.append(Scope(tenant_scope(identity.tenant), tenant))
        if not scopes:
            return await handler(request)
        result = limiter.admit(scopes)
        if isinstance(result, Refusal):
            raise _rate_limited(result)
        admission = result
        request[RATE_HEADERS] = admission.headers  # reserve() updates the token headers in place

        def reserve(tokens: int) -> None:
            refusal = limiter.reserve(admission, tokens)
            if refusal is not None:
                raise _rate_limited(refusal)

        meter = Meter(reserve=reserve if any(s.limits.tokens_per_minute for s in scopes) else None)
        token = CURRENT_METER.set(meter)
        try:
            return await handler(request)
        finally:
            CURRENT_METER.reset(token)
            limiter.settle(admission, meter.tokens)

    return limit


def _rate_limited(refusal: Refusal) -> RateLimited:
    whose = "key" if refusal.scope.key.startswith("k:") else "tenant"
    return RateLimited(
        f"{_MESSAGES[refusal.verdict.refused or 'capacity']} of this {whose}. "
        f"Retry after {refusal.verdict.headers.get('Retry-After', '1')} s.",
        headers=refusal.verdict.headers,
    )


async def add_rate_headers(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: the admitted request's x-ratelimit-* headers, before any byte is sent."""
    headers = request.get(RATE_HEADERS)
    if headers:
        response.headers.update(headers)
