"""The API keys' admin API: POST /admin/keys, GET /admin/keys[/{id}], DELETE /admin/keys/{id}.

The key's full text is in the POST answer and nowhere else, ever: the cluster stores only its hash.
Changes go to the cluster's key table, so a key works (or stops working) on every node, and to the key
store when one is configured (node/cluster/key_store.py): a created key is answered once it is durable.
"""

from __future__ import annotations

import time
from typing import Final

import msgspec
from aiohttp import web

from node.auth.identity import Limits
from node.auth.keys import ROLES
from node.cluster.api_keys import TooManyKeys
from node.cluster.key_store import DurableKeys
from node.errors import GatewayError, InvalidRequest, NotFound
from node.http.errors import read_json
from storage.errors import InvalidInput, StorageError
from storage.validation import check_tenant

MAX_KEY_BODY_BYTES: Final = 8 * 1024
#: The longest lifetime a key may be given at creation (10 years); 0/absent: no expiry.
MAX_EXPIRES_IN_S: Final = 10 * 365 * 86_400


class KeyTableFull(GatewayError):
    status = 409
    error_type = "invalid_request_error"
    code = "too_many_keys"


class KeyStoreUnavailable(GatewayError):
    status = 503
    error_type = "server_error"
    code = "key_store_unavailable"


class LimitsBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    requests_per_minute: int = 0
    tokens_per_minute: int = 0
    concurrent: int = 0


class CreateKey(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    tenant: str = "default"
    role: str = "user"
    name: str = ""
    expires_in_s: int = 0
    limits: LimitsBody = msgspec.field(default_factory=LimitsBody)


def _json(body: object, status: int = 200) -> web.Response:
    return web.Response(body=msgspec.json.encode(body), status=status, content_type="application/json")


def add_key_routes(app: web.Application, durable: DurableKeys) -> None:
    keys = durable.table

    async def create(request: web.Request) -> web.Response:
        body = await read_json(request, CreateKey, MAX_KEY_BODY_BYTES)
        if body.role not in ROLES:
            raise InvalidRequest(f"'role' must be one of {', '.join(ROLES)}.", param="role")
        try:
            check_tenant(body.tenant)
        except InvalidInput as exc:
            raise InvalidRequest(f"'tenant': {exc}", param="tenant") from None
        if not 0 <= body.expires_in_s <= MAX_EXPIRES_IN_S:
            raise InvalidRequest(f"'expires_in_s' must be in 0..{MAX_EXPIRES_IN_S} (0: never).", param="expires_in_s")
        try:
            limits = Limits(**msgspec.structs.asdict(body.limits))
        except ValueError as exc:
            raise InvalidRequest(str(exc), param=str(exc).partition(":")[0]) from None
        expires_at = time.time() + body.expires_in_s if body.expires_in_s else 0.0
        try:
            text, record = await durable.create(
                tenant=body.tenant,
                role=body.role,  # type: ignore[arg-type]  # checked against ROLES above
                name=body.name,
                expires_at=expires_at,
                limits=limits,
            )
        except TooManyKeys as exc:
            raise KeyTableFull(f"{exc}; revoked keys still count.") from None
        except StorageError:
            raise KeyStoreUnavailable("The key store is unavailable; no key was created. Retry later.") from None
        except ValueError as exc:
            raise InvalidRequest(str(exc), param=str(exc).partition(":")[0]) from None
        return _json({**record.public_json(), "key": text}, status=201)

    def find(request: web.Request) -> str:
        key_id = request.match_info["key_id"]
        if keys.get(key_id) is None:
            raise NotFound(f"No API key with id '{key_id[:64]}'.", param="key_id")
        return key_id

    async def list_keys(request: web.Request) -> web.Response:
        return _json({"object": "list", "data": [r.public_json() for r in keys.records()]})

    async def get_key(request: web.Request) -> web.Response:
        record = keys.get(find(request))
        assert record is not None
        return _json(record.public_json())

    async def revoke(request: web.Request) -> web.Response:
        key_id = find(request)
        try:
            record = await durable.revoke(key_id)
        except StorageError:
            raise KeyStoreUnavailable(
                "The key is revoked on every node, but the key store is unavailable: the revocation is written "
                "there when it is back. Repeat the request to check."
            ) from None
        assert record is not None
        return _json({**record.public_json(), "deleted": True})

    app.router.add_post("/admin/keys", create)
    app.router.add_get("/admin/keys", list_keys)
    app.router.add_get("/admin/keys/{key_id}", get_key)
    app.router.add_delete("/admin/keys/{key_id}", revoke)
