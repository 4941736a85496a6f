"""Which tenant a request belongs to: every Responses/Conversations id lives in exactly one tenant's space.

With authentication on, the tenant is the verified identity's (its API key's), whatever the headers say.
Without, it is read from `X-SMG-Tenant` only when the operator says an authenticating proxy in front of the
node sets (and strips) that header; otherwise any client could read another tenant's history by naming it,
so every request belongs to the one tenant `default`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from node.config import TENANT_HEADER, ApiConfig
from node.pipeline.context import DEFAULT_TENANT

if TYPE_CHECKING:  # the config is loaded by the CLI, which need not import the HTTP framework
    from aiohttp import web

# ApiConfig and the header name live in node.config with every component's config; re-exported here.
__all__ = ["DEFAULT_TENANT", "TENANT_HEADER", "ApiConfig", "tenant_claim"]


def tenant_claim(request: web.Request, config: ApiConfig) -> str | None:
    """The tenant the request names, unchecked: the header's value when the operator trusts it, else None
    (the default tenant). Checked by ``RequestContext.tenant`` on first use, so only routes that use a
    tenant refuse a bad one."""
    return request.headers.get(TENANT_HEADER) if config.trust_tenant_header else None
