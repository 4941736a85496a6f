"""Cursor-paginated lists of the OpenAI API (`?after=&limit=&order=` in, `{data, first_id, last_id, has_more}`
out), and the ids and JSON answers the Responses and Conversations endpoints share."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import msgspec
from aiohttp import web

from node.errors import InvalidRequest
from storage.base import DEFAULT_PAGE_LIMIT, MAX_PAGE_LIMIT, Item, ItemPage, Order

# 24 random bytes: ids are unguessable and collide with negligible probability (OpenAI's are as long).
ID_RANDOM_BYTES = 24


def mint_id(prefix: str) -> str:
    """A fresh OpenAI-style id, e.g. `resp_5f0c...`; the alphabet is one every store accepts."""
    return f"{prefix}_{secrets.token_hex(ID_RANDOM_BYTES)}"


def json_response(obj: object, status: int = 200) -> web.Response:
    return web.Response(status=status, body=msgspec.json.encode(obj), content_type="application/json")


@dataclass(frozen=True, slots=True)
class PageQuery:
    after: str | None
    limit: int
    order: Order


def page_query(request: web.Request) -> PageQuery:
    """Parse `after`, `limit` (1..100, default 20) and `order` (asc|desc, default desc).

    Raises InvalidRequest naming the parameter."""
    q = request.query
    raw_limit = q.get("limit")
    limit = DEFAULT_PAGE_LIMIT
    if raw_limit is not None:
        try:
            limit = int(raw_limit)
        except ValueError:
            raise InvalidRequest(f"'limit' must be an integer, got {raw_limit!r}.", param="limit") from None
        if not 1 <= limit <= MAX_PAGE_LIMIT:
            raise InvalidRequest(f"'limit' must be between 1 and {MAX_PAGE_LIMIT}, got {limit}.", param="limit")
    order = q.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidRequest(f"'order' must be 'asc' or 'desc', got {order!r}.", param="order")
    return PageQuery(after=q.get("after") or None, limit=limit, order="asc" if order == "asc" else "desc")


def list_object(items: tuple[Item, ...] | list[Item], *, has_more: bool) -> dict[str, object]:
    return {
        "object": "list",
        "data": [item.body for item in items],
        "first_id": items[0].id if items else None,
        "last_id": items[-1].id if items else None,
        "has_more": has_more,
    }


def page_object(page: ItemPage) -> dict[str, object]:
    return list_object(page.items, has_more=page.has_more)
