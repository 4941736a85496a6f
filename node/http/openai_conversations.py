"""The OpenAI Conversations API: /v1/conversations (create, retrieve, update metadata, delete) and
/v1/conversations/{id}/items (list, add up to 20, retrieve, delete).

Items are validated and stored in the same canonical form as Responses input items, so a conversation can
be the context of POST /v1/responses (`conversation`), which appends each turn's input and output to it.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from node.errors import InvalidRequest
from node.http.adapter import AdapterEnv, Route
from node.http.envelopes import OPENAI, ErrorEnvelope
from node.http.errors import read_json
from node.http.middleware import context_of
from node.http.openai_common import now_s
from node.http.pages import json_response, list_object, mint_id, page_object, page_query
from node.http.responses_types import ConversationCreateRequest, ConversationUpdateRequest, ItemsCreateRequest
from node.pipeline import responses_items
from storage.base import MAX_ITEMS_PER_ADD, Conversation, Item
from storage.errors import InvalidInput
from storage.validation import check_metadata

_CONVERSATION_ID = "conversation_id"


def conversation_object(conv: Conversation) -> dict[str, Any]:
    return {"id": conv.id, "object": "conversation", "created_at": conv.created_at, "metadata": dict(conv.metadata)}


def _metadata(metadata: dict[str, str] | None) -> dict[str, str]:
    if metadata is None:
        return {}
    try:
        check_metadata(metadata)
    except InvalidInput as exc:
        raise InvalidRequest(f"Invalid 'metadata': {exc}.", param="metadata") from exc
    return metadata


def _items(raw: list[Any], *, allow_empty: bool) -> list[Item]:
    """Raises InvalidRequest naming the offending item field, or for a count outside 1..20 (0..20 at create)."""
    if not (0 if allow_empty else 1) <= len(raw) <= MAX_ITEMS_PER_ADD:
        raise InvalidRequest(f"'items' must hold 1 to {MAX_ITEMS_PER_ADD} items, got {len(raw)}.", param="items")
    return [Item.from_json(i) for i in responses_items.normalize_input(raw, mint_id, param="items")]


class Conversations:
    envelope: ErrorEnvelope = OPENAI

    def __init__(self, env: AdapterEnv) -> None:
        self._history = env.history
        self._max_body = env.max_body_bytes

    def routes(self) -> list[Route]:
        base = "/v1/conversations/{conversation_id}"
        return [
            Route("POST", "/v1/conversations", self.create),
            Route("GET", base, self.retrieve),
            Route("POST", base, self.update),
            Route("DELETE", base, self.delete),
            Route("GET", base + "/items", self.list_items),
            Route("POST", base + "/items", self.add_items),
            Route("GET", base + "/items/{item_id}", self.get_item),
            Route("DELETE", base + "/items/{item_id}", self.delete_item),
        ]

    async def create(self, request: web.Request) -> web.Response:
        req = await read_json(request, ConversationCreateRequest, self._max_body)
        tenant = context_of(request).tenant
        conv = Conversation(id=mint_id("conv"), created_at=now_s(), metadata=_metadata(req.metadata))
        initial = _items(req.items or [], allow_empty=True)
        history = self._history
        created = await history.run(lambda: history.conversations.create(tenant, conv, initial))
        return json_response(conversation_object(created))

    async def retrieve(self, request: web.Request) -> web.Response:
        tenant = context_of(request).tenant
        cid = request.match_info[_CONVERSATION_ID]
        history = self._history
        conv = await history.run(lambda: history.conversations.get(tenant, cid))
        return json_response(conversation_object(conv))

    async def update(self, request: web.Request) -> web.Response:
        req = await read_json(request, ConversationUpdateRequest, self._max_body)
        tenant = context_of(request).tenant
        cid = request.match_info[_CONVERSATION_ID]
        metadata = _metadata(req.metadata)
        history = self._history
        conv = await history.run(lambda: history.conversations.update_metadata(tenant, cid, metadata))
        return json_response(conversation_object(conv))

    async def delete(self, request: web.Request) -> web.Response:
        tenant = context_of(request).tenant
        cid = request.match_info[_CONVERSATION_ID]
        history = self._history
        await history.run(lambda: history.conversations.delete(tenant, cid))
        return json_response({"id": cid, "object": "conversation.deleted", "deleted": True})

    async def list_items(self, request: web.Request) -> web.Response:
        tenant = context_of(request).tenant
        cid = request.match_info[_CONVERSATION_ID]
        q = page_query(request)
        history = self._history
        page = await history.run(
            lambda: history.conversations.list_items(tenant, cid, after=q.after, limit=q.limit, order=q.order)
        )
        return json_response(page_object(page))

    async def add_items(self, request: web.Request) -> web.Response:
        req = await read_json(request, ItemsCreateRequest, self._max_body)
        tenant = context_of(request).tenant
        cid = request.match_info[_CONVERSATION_ID]
        added = _items(req.items, allow_empty=False)
        history = self._history
        await history.run(lambda: history.conversations.add_items(tenant, cid, added), param="items")
        return json_response(list_object(added, has_more=False))

    async def get_item(self, request: web.Request) -> web.Response:
        tenant = context_of(request).tenant
        cid, item_id = request.match_info[_CONVERSATION_ID], request.match_info["item_id"]
        history = self._history
        item = await history.run(lambda: history.conversations.get_item(tenant, cid, item_id))
        return json_response(item.body)

    async def delete_item(self, request: web.Request) -> web.Response:
        """Answers with the conversation, as OpenAI does."""
        tenant = context_of(request).tenant
        cid, item_id = request.match_info[_CONVERSATION_ID], request.match_info["item_id"]
        history = self._history
        await history.run(lambda: history.conversations.delete_item(tenant, cid, item_id))
        conv = await history.run(lambda: history.conversations.get(tenant, cid))
        return json_response(conversation_object(conv))
