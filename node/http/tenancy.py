"""Which tenant a request belongs to: every Responses/Conversations id lives in exactly one tenant's space.

With authentication on, the tenant is the verified identity's (its API key's), whatever the headers say.
Without, it is read from `X-SMG-Tenant` only when the operator says an authenticating proxy in front of the
node sets (and strips) that header; otherwise any client could read another tenant's history by naming it,
so every request belongs to the one tenant `default`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from node.config import TENANT_HEADER, ApiConfig
from node.errors import InvalidRequest
from node.http.auth_middleware import IDENTITY
from storage.errors import InvalidInput
from storage.validation import check_tenant

if TYPE_CHECKING:  # the config is loaded by the CLI, which need not import the HTTP framework
    from aiohttp import web

DEFAULT_TENANT = "default"

# ApiConfig and the header name live in node.config with every component's config; re-exported here.
__all__ = ["DEFAULT_TENANT", "TENANT_HEADER", "ApiConfig", "tenant_of"]


def tenant_of(request: web.Request, config: ApiConfig) -> str:
    """The request's tenant. Raises InvalidRequest (400) for a header value no store accepts."""
    if IDENTITY in request:
        return request[IDENTITY].tenant
    if not config.trust_tenant_header:
        return DEFAULT_TENANT
    tenant = request.headers.get(TENANT_HEADER)
    if tenant is None:
        return DEFAULT_TENANT
    try:
        check_tenant(tenant)
    except InvalidInput as exc:
        raise InvalidRequest(f"Invalid {TENANT_HEADER} header: {exc}", param=TENANT_HEADER) from exc
    return tenant
