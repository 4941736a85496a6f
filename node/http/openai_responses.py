"""The OpenAI Responses API: POST /v1/responses (JSON or SSE), GET/DELETE /v1/responses/{id},
GET /v1/responses/{id}/input_items.

A turn's context is, in order: `instructions` (a system message; never inherited through
previous_response_id), the items of the previous_response_id chain or of the conversation, then the new
input items. It is rendered with the model's chat template and generated like a chat completion.

Durable before acknowledged: with store=true (the default) the response, its input items and its output are
written before the JSON answer or the terminal stream event leaves; a failed write turns the answer into an
error (JSON: 503 or 500, see node/http/history.py) or response.failed (stream), never a success the store does
not know. With a conversation the new input and output items are appended to it in the same write.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from aiohttp import web

from node.errors import GatewayError, InvalidRequest
from node.http import openai_common as common
from node.http.adapter import AdapterEnv, Route
from node.http.errors import read_json
from node.http.middleware import context_of
from node.http.pages import json_response, mint_id, page_object, page_query
from node.http.responses_output import ResponseOutput
from node.http.responses_stream import ResponseEvents
from node.http.responses_types import ResponsesRequest
from node.http.sse import open_stream
from node.pipeline import responses_items as items
from node.pipeline.events import Finish, Usage
from node.pipeline.request import ChatPrompt, GenerateRequest, Sampling
from node.pipeline.run import Run
from node.pipeline.served_model import ServedModel
from storage.base import MAX_ITEMS_PER_ADD, MAX_PAGE_LIMIT, Item, ResponseRecord
from storage.errors import InvalidInput
from storage.validation import check_metadata

# Bound on the conversation items loaded as one turn's context (100 per page); past it the request is a 400
# rather than an unbounded read. The context window usually refuses such a prompt long before.
MAX_CONVERSATION_CONTEXT_ITEMS = 10_000


def usage_object(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        # cache_write_tokens: OpenAI's explicit cache writes; engines here cache prefixes implicitly.
        "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.total_tokens,
    }


@dataclass(frozen=True, slots=True)
class _Turn:
    """One create request after validation: what the response object and the stored record are built from."""

    id: str
    created_at: int
    tenant: str
    req: ResponsesRequest
    inputs: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    temperature: float
    top_p: float
    model: str
    tool_choice: Any

    def response(
        self,
        *,
        status: str,
        output: list[dict[str, Any]],
        usage: Usage | None = None,
        error: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The Response object: every field OpenAI's schema lists, with its documented type."""
        req = self.req
        conv = req.conversation_id
        done = status in ("completed", "incomplete")
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "completed_at": common.now_s() if done else None,
            "status": status,
            "background": False,
            "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "max_tool_calls": req.max_tool_calls,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": req.parallel_tool_calls,
            "previous_response_id": req.previous_response_id,
            "conversation": {"id": conv} if conv is not None else None,
            "reasoning": {"effort": None, "summary": None, **(req.reasoning or {})},
            "store": req.store,
            "service_tier": req.service_tier or "default",
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_logprobs": req.top_logprobs or 0,
            "presence_penalty": req.presence_penalty or 0.0,
            "frequency_penalty": req.frequency_penalty or 0.0,
            "tool_choice": self.tool_choice,
            "tools": self.tools,
            # Echoed as sent (node.pipeline.constraints validated it), the default when absent.
            "text": req.text if isinstance(req.text, dict) and req.text.get("format") else {"format": {"type": "text"}},
            "truncation": req.truncation or "disabled",
            "usage": usage_object(usage) if usage is not None else None,
            "user": req.user,
            "safety_identifier": req.safety_identifier,
            "prompt_cache_key": req.prompt_cache_key,
            "metadata": req.metadata or {},
        }


def _failed(exc: GatewayError) -> dict[str, Any]:
    return {"code": "server_error", "message": exc.message}


def responses_sampling(req: ResponsesRequest) -> Sampling:
    """The neutral sampling fields of a Responses request (no logprobs). Raises InvalidRequest."""
    if req.n != 1:
        raise InvalidRequest("'n' must be 1 for the Responses API.", param="n")
    return common.sampling_of(req, max_tokens=req.max_output_tokens, logprobs=None)


class Responses(common.OpenAIAdapter):
    def __init__(self, env: AdapterEnv) -> None:
        super().__init__(env)
        self._history = env.history

    def routes(self) -> list[Route]:
        return [
            Route("POST", "/v1/responses", self.create),
            Route("GET", "/v1/responses/{response_id}", self.retrieve),
            Route("DELETE", "/v1/responses/{response_id}", self.delete),
            Route("GET", "/v1/responses/{response_id}/input_items", self.input_items),
        ]

    # --- create -----------------------------------------------------------------------------------------

    def _validate(self, req: ResponsesRequest, model: ServedModel) -> tuple[str | list[Any], Sampling]:
        """Checks that need no storage; returns the input and the sampling fields. Raises InvalidRequest."""
        sampling = responses_sampling(req)
        # Prepare checks these again; here they refuse bad input before any storage is touched.
        self._pipeline.check(sampling, model)
        if req.input is None:
            raise InvalidRequest("Missing required parameter: 'input'.", param="input")
        if req.previous_response_id is not None and req.conversation is not None:
            raise InvalidRequest(
                "'previous_response_id' and 'conversation' cannot be used together.", param="previous_response_id"
            )
        if req.metadata is not None:
            try:
                check_metadata(req.metadata)
            except InvalidInput as exc:
                raise InvalidRequest(f"Invalid 'metadata': {exc}.", param="metadata") from exc
        return req.input, sampling

    async def _context(self, tenant: str, req: ResponsesRequest) -> list[Mapping[str, Any]]:
        """The stored items this turn continues from (chain or conversation), oldest first."""
        history = self._history
        prev = req.previous_response_id
        if prev is not None:
            chain = await history.run(lambda: history.responses.load_chain(tenant, prev), param="previous_response_id")
            return [item.body for item in chain]
        conv = req.conversation_id
        if conv is None:
            return []
        loaded: list[Mapping[str, Any]] = []
        after: str | None = None
        while True:
            page = await history.run(
                partial(history.conversations.list_items, tenant, conv, after=after, limit=MAX_PAGE_LIMIT, order="asc"),
                param="conversation",
            )
            loaded.extend(item.body for item in page.items)
            if not page.has_more:
                return loaded
            if len(loaded) >= MAX_CONVERSATION_CONTEXT_ITEMS:
                raise InvalidRequest(
                    f"The conversation holds more than {MAX_CONVERSATION_CONTEXT_ITEMS} items.", param="conversation"
                )
            after = page.last_id

    async def create(self, request: web.Request) -> web.StreamResponse:
        ctx = context_of(request)
        req = await read_json(request, ResponsesRequest, self._max_body)
        pipeline = self._pipeline
        model = pipeline.model(req.model)
        raw_input, sampling = self._validate(req, model)
        tenant = ctx.tenant
        inputs = items.normalize_input(raw_input, mint_id)
        tools = items.normalize_tools(req.tools)
        tool_use = common.tool_use(
            {t["name"]: t["parameters"] or {} for t in tools},
            req.tool_choice,
            parallel=req.parallel_tool_calls,
            api="responses",
            max_calls=req.max_tool_calls,
        )
        constrained = common.output_constraint(req, tools=tools, tool_choice=req.tool_choice, text_format=req.text)
        conv = req.conversation_id
        if not req.store and conv is not None and len(inputs) + 1 > MAX_ITEMS_PER_ADD:
            raise InvalidRequest(
                f"With store=false at most {MAX_ITEMS_PER_ADD - 1} input items can be added to a conversation.",
                param="input",
            )
        context = await self._context(tenant, req)
        if req.store or conv is not None:
            # Do not generate an answer that cannot be stored: fail now while the store is known to be down or,
            # when it has not answered lately, does not answer one cheap read (after _context's reads, if any).
            await self._history.ensure_reachable(tenant)
        messages = items.chat_messages([*context, *inputs], instructions=req.instructions)
        if not messages:
            raise InvalidRequest("'input' must contain at least one item.", param="input")
        prompt = ChatPrompt(
            messages=messages,
            # tool_choice "none": the tools are not offered to the model at all.
            tools=items.chat_tools(tools) if tool_use is not None and tool_use.choice != "none" else None,
            template_kwargs=req.chat_template_kwargs,
        )
        neutral = GenerateRequest(
            model=req.model,
            prompts=(prompt,),
            sampling=sampling,
            stream=req.stream,
            budget_param="max_output_tokens",
            prompt_param="input",
            tools=tool_use,
            constraint=constrained.constraint if constrained is not None else None,
        )
        rid = mint_id("resp")
        prepared = await pipeline.prepare(neutral, model, ctx, request_id=rid)
        params = prepared.params
        turn = _Turn(
            id=rid,
            created_at=common.now_s(),
            tenant=tenant,
            req=req,
            inputs=inputs,
            tools=tools,
            temperature=params.temperature if params.temperature is not None else 1.0,
            top_p=params.top_p,
            model=model.name,
            tool_choice=req.tool_choice if req.tool_choice is not None else "auto",
        )
        run = pipeline.run(prepared, ctx)
        if req.stream:
            return await self._stream(request, turn, run)
        return await self._complete(turn, run)

    async def _persist(self, turn: _Turn, response: dict[str, Any], output: list[dict[str, Any]]) -> None:
        """Make the finished response durable (store=true) or at least its items (conversation only).

        Raises StorageUnavailableError, StorageContendedError, StorageFailed, NotFound (the previous response
        or conversation vanished meanwhile), StorageConflict (an input item id already in the conversation)."""
        req = turn.req
        history = self._history
        inputs = [Item.from_json(i) for i in turn.inputs]
        conv = req.conversation_id
        param = "conversation" if conv is not None else "previous_response_id"
        if req.store:
            body = {k: v for k, v in response.items() if k != "output"}
            record = ResponseRecord(
                id=turn.id,
                created_at=turn.created_at,
                body=body,
                output=tuple(Item.from_json(item) for item in output),
                previous_response_id=req.previous_response_id,
                conversation_id=conv,
            )
            await history.run(lambda: history.responses.put(turn.tenant, record, inputs), param=param)
        elif conv is not None:
            added = [*inputs, *(Item.from_json(item) for item in output)]
            await history.run(lambda: history.conversations.add_items(turn.tenant, conv, added), param=param)

    async def _complete(self, turn: _Turn, run: Run) -> web.Response:
        output = ResponseOutput(mint_id)
        reason: str | None = None
        usage = run.usage
        async with contextlib.aclosing(run.events()) as events:
            async for batch in events:
                for ev in batch:
                    if type(ev) is Finish:
                        reason = ev.reason
                    elif type(ev) is Usage:
                        usage = ev
                    else:
                        output.feed(ev)
        output.finish(reason)
        status = "incomplete" if reason == "length" else "completed"
        response = turn.response(status=status, output=output.items, usage=usage)
        await self._persist(turn, response, output.items)
        return json_response(response)

    async def _stream(self, request: web.Request, turn: _Turn, run: Run) -> web.StreamResponse:
        frames = ResponseEvents()
        output = ResponseOutput(mint_id, frames)
        reason: str | None = None
        usage = run.usage
        async with contextlib.aclosing(run.events()) as events:
            # The first batch is awaited before the 200 goes out, so "no healthy worker" or a worker that
            # cannot be reached is a plain HTTP error, not a broken stream.
            first = await anext(events, None)
            resp = await open_stream(request)  # writes wait for a slow reader (node/http/sse.py)
            started = turn.response(status="in_progress", output=[])
            await resp.write(
                frames.response("response.created", started) + frames.response("response.in_progress", started)
            )
            try:
                batch = first
                while batch is not None:
                    chunk = b""
                    for ev in batch:
                        if type(ev) is Finish:
                            reason = ev.reason
                        elif type(ev) is Usage:
                            usage = ev
                        else:
                            chunk += output.feed(ev)
                    if chunk:
                        await resp.write(chunk)
                    batch = await anext(events, None)
            except GatewayError as exc:
                failed = turn.response(status="failed", output=output.items, error=_failed(exc))
                await resp.write(frames.response("response.failed", failed))
                return resp
        status = "incomplete" if reason == "length" else "completed"
        await resp.write(output.finish(reason))
        final = turn.response(status=status, output=output.items, usage=usage)
        try:
            await self._persist(turn, final, output.items)
        except GatewayError as exc:
            failed = turn.response(status="failed", output=output.items, usage=usage, error=_failed(exc))
            await resp.write(frames.response("response.failed", failed))
            return resp
        await resp.write(frames.response(f"response.{status}", final))
        return resp

    # --- stored responses -------------------------------------------------------------------------------

    async def retrieve(self, request: web.Request) -> web.Response:
        tenant = context_of(request).tenant
        rid = request.match_info["response_id"]
        history = self._history
        record = await history.run(lambda: history.responses.get(tenant, rid))
        return json_response({**record.body, "output": [item.body for item in record.output]})

    async def delete(self, request: web.Request) -> web.Response:
        tenant = context_of(request).tenant
        rid = request.match_info["response_id"]
        history = self._history
        await history.run(lambda: history.responses.delete(tenant, rid))
        return json_response({"id": rid, "object": "response", "deleted": True})

    async def input_items(self, request: web.Request) -> web.Response:
        tenant = context_of(request).tenant
        rid = request.match_info["response_id"]
        q = page_query(request)
        history = self._history
        page = await history.run(
            lambda: history.responses.list_input_items(tenant, rid, after=q.after, limit=q.limit, order=q.order)
        )
        return json_response(page_object(page))
