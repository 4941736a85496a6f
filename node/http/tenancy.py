"""Which tenant a request belongs to: every Responses/Conversations id lives in exactly one tenant's space.

The tenant is read from `X-SMG-Tenant` only when the operator says an authenticating proxy in front of the
node sets (and strips) that header; otherwise any client could read another tenant's history by naming it,
so every request belongs to the one tenant `default`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from node.errors import InvalidRequest
from storage.errors import InvalidInput
from storage.validation import check_tenant

if TYPE_CHECKING:  # the config is loaded by the CLI, which need not import the HTTP framework
    from aiohttp import web

TENANT_HEADER = "X-SMG-Tenant"
DEFAULT_TENANT = "default"


@dataclass(frozen=True, slots=True)
class ApiConfig:
    trust_tenant_header: bool = field(
        default=False,
        metadata={
            "help": f"take the Responses/Conversations tenant from the {TENANT_HEADER} header; set only when a "
            "trusted proxy in front of the node sets it (otherwise every request is tenant 'default')"
        },
    )


def tenant_of(request: web.Request, config: ApiConfig) -> str:
    """The request's tenant. Raises InvalidRequest (400) for a header value no store accepts."""
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
