"""Tenants' limits through the admin API: PUT/GET /admin/tenants/{tenant}/limits, GET /admin/tenants.

All-zero limits clear a tenant's limits. Keys carry their own limits (POST /admin/keys); a request is
admitted under both.
"""

from __future__ import annotations

from typing import Final

import msgspec
from aiohttp import web

from node.auth.identity import Limits
from node.cluster.tenant_limits import TenantLimits, TooManyTenants
from node.errors import InvalidRequest
from node.http.errors import read_json
from node.http.keys_api import KeyTableFull, LimitsBody
from storage.errors import InvalidInput
from storage.validation import check_tenant

MAX_LIMITS_BODY_BYTES: Final = 4 * 1024


def _json(body: object, status: int = 200) -> web.Response:
    return web.Response(body=msgspec.json.encode(body), status=status, content_type="application/json")


def add_limit_routes(app: web.Application, tenants: TenantLimits) -> None:
    def tenant_of(request: web.Request) -> str:
        tenant = request.match_info["tenant"]
        try:
            check_tenant(tenant)
        except InvalidInput as exc:
            raise InvalidRequest(f"'tenant': {exc}", param="tenant") from None
        return tenant

    def body_of(tenant: str) -> dict[str, object]:
        limits = tenants.get(tenant) or Limits()
        return {"object": "tenant_limits", "tenant": tenant, "limits": limits.to_json()}

    async def put(request: web.Request) -> web.Response:
        tenant = tenant_of(request)
        body = await read_json(request, LimitsBody, MAX_LIMITS_BODY_BYTES)
        try:
            tenants.set(tenant, Limits(**msgspec.structs.asdict(body)))
        except ValueError as exc:
            raise InvalidRequest(str(exc), param=str(exc).partition(":")[0]) from None
        except TooManyTenants as exc:
            raise KeyTableFull(str(exc), code="too_many_tenants") from None
        return _json(body_of(tenant))

    async def get(request: web.Request) -> web.Response:
        return _json(body_of(tenant_of(request)))

    async def list_all(request: web.Request) -> web.Response:
        data = [{"tenant": t, "limits": limits.to_json()} for t, limits in tenants.all().items()]
        return _json({"object": "list", "data": data})

    app.router.add_put("/admin/tenants/{tenant}/limits", put)
    app.router.add_get("/admin/tenants/{tenant}/limits", get)
    app.router.add_get("/admin/tenants", list_all)
