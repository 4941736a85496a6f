"""The Anthropic Messages adapter: POST /v1/messages and /v1/messages/count_tokens parsed into the neutral
request, the pipeline's events rendered as Anthropic's message JSON or its SSE event stream, every error in
Anthropic's envelope and statuses. Stateless: nothing of a request is stored.

How a request maps onto the open model: node/http/anthropic_request.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Final

import msgspec
from aiohttp import web

from node.config import RequestLimits
from node.errors import GatewayError, InvalidRequest
from node.http.adapter import AdapterEnv, Route
from node.http.anthropic_blocks import Blocks, MessageSink
from node.http.anthropic_request import chat_prompt, messages_request
from node.http.anthropic_types import CountTokensRequest, MessagesRequest
from node.http.envelopes import EdgeError
from node.http.errors import REQUEST_LIMITS, read_json
from node.http.ids import random_hex
from node.http.middleware import context_of
from node.http.sse import SseStream, open_stream
from node.pipeline.events import ContentDelta, Finish, ReasoningDelta, ToolCallDelta, Usage
from node.pipeline.request import GenerateRequest, Sampling
from node.pipeline.run import Run

_ENCODE = msgspec.json.Encoder().encode

#: Beta features this adapter serves as Anthropic does without the header (caching is the engine's and
#: automatic; thinking interleaves with tool use; tool input streams as it is generated; token counting).
KNOWN_BETAS: Final = frozenset(
    {
        "messages-2023-12-15",
        "prompt-caching-2024-07-31",
        "token-counting-2024-11-01",
        "interleaved-thinking-2025-05-14",
        "fine-grained-tool-streaming-2025-05-14",
    }
)
#: A stream with nothing to send for this long sends a ``ping`` event (as Anthropic's do), so proxies and
#: clients with idle timeouts keep a long prefill or a slow model's stream open.
PING_INTERVAL_S: Final = 10.0

# Anthropic's error types by HTTP status; a status Anthropic does not use maps to the nearest it does.
_TYPES: Final = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def anthropic_status(status: int) -> int:
    """Anthropic's status for ours: 503 (no healthy worker) is its 529 overloaded; 502 (a worker failed) its
    500; another 4xx keeps its status (an invalid_request_error)."""
    if status in _TYPES:
        return status
    if status == 503:
        return 529
    return 500 if status >= 500 else status


class AnthropicEnvelope:
    """{"type": "error", "error": {"type", "message"}, "request_id"} (Anthropic's API names the request at the top)"""

    def status(self, error: EdgeError) -> int:
        return anthropic_status(error.status)

    def body(self, error: EdgeError) -> bytes:
        body = error_object(error.status, error.message)
        if error.request_id is not None:
            body["request_id"] = error.request_id
        return _ENCODE(body)


ANTHROPIC = AnthropicEnvelope()


def error_object(status: int, message: str) -> dict[str, Any]:
    kind = _TYPES.get(anthropic_status(status), "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def _check_limits(req: CountTokensRequest, request: web.Request) -> None:
    """The node's request limits (node.config.RequestLimits) over this API's fields."""
    limits = request.config_dict.get(REQUEST_LIMITS) or RequestLimits()
    if len(req.messages) > limits.max_messages:
        raise InvalidRequest(
            f"messages: {len(req.messages)} messages, more than this server's limit of {limits.max_messages} "
            "(max_messages).",
            param="messages",
        )
    for i, msg in enumerate(req.messages):
        if isinstance(msg.content, list) and len(msg.content) > limits.max_content_parts:
            raise InvalidRequest(
                f"messages.{i}.content: more than this server's limit of {limits.max_content_parts} blocks "
                "(max_content_parts).",
                param=f"messages.{i}.content",
            )
    if req.tools is not None and len(req.tools) > limits.max_tools:
        raise InvalidRequest(f"tools: more than this server's limit of {limits.max_tools} (max_tools).", param="tools")
    if isinstance(req, MessagesRequest) and req.max_tokens > limits.max_output_tokens_total:
        raise InvalidRequest(
            f"max_tokens: {req.max_tokens}, more than this server's limit of {limits.max_output_tokens_total} "
            "(max_output_tokens_total).",
            param="max_tokens",
        )
    if isinstance(req, MessagesRequest) and req.stop_sequences is not None:
        if len(req.stop_sequences) > limits.max_stop_strings:
            raise InvalidRequest(
                f"stop_sequences: more than this server's limit of {limits.max_stop_strings} (max_stop_strings).",
                param="stop_sequences",
            )
        if any(len(s) > limits.max_stop_chars for s in req.stop_sequences):
            raise InvalidRequest(
                f"stop_sequences: a sequence longer than this server's limit of {limits.max_stop_chars} "
                "characters (max_stop_chars).",
                param="stop_sequences",
            )


def _check_headers(request: web.Request) -> None:
    """``anthropic-version`` is accepted whatever its value; an ``anthropic-beta`` feature this server does
    not serve is refused (a client asking for one relies on behaviour it would not get)."""
    for header in request.headers.getall("anthropic-beta", ()):
        for feature in (f.strip() for f in header.split(",")):
            if feature and feature not in KNOWN_BETAS:
                raise InvalidRequest(
                    f"anthropic-beta: unsupported beta feature {feature!r}; this server supports "
                    f"{', '.join(sorted(KNOWN_BETAS))}.",
                    param="anthropic-beta",
                )


# --- events → message -----------------------------------------------------------------------------------


def stop_reason(finish: Finish | None, tool_calls: int) -> tuple[str | None, str | None]:
    """(stop_reason, stop_sequence) of a finished answer."""
    if finish is None:
        return None, None
    if finish.stop is not None:
        return "stop_sequence", finish.stop
    if finish.reason == "length":
        return "max_tokens", None
    return ("tool_use" if tool_calls else "end_turn"), None


def usage_object(usage: Usage) -> dict[str, int]:
    """Anthropic's usage: ``input_tokens`` are the prompt tokens not read from the engine's prefix cache."""
    return {
        "input_tokens": usage.prompt_tokens - usage.cached_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": usage.cached_tokens,
        "output_tokens": usage.completion_tokens,
    }


def _feed(blocks: Blocks, batch: list[Any]) -> tuple[Finish | None, Usage | None]:
    finish: Finish | None = None
    usage: Usage | None = None
    for ev in batch:
        kind = type(ev)
        if kind is ContentDelta:
            blocks.text(ev.text)
        elif kind is ReasoningDelta:
            blocks.thinking(ev.text)
        elif kind is ToolCallDelta:
            blocks.tool(ev.call, ev.name, ev.arguments)
        elif kind is Finish:
            finish = ev
        elif kind is Usage:
            usage = ev
    return finish, usage


def _event(name: bytes, obj: Any) -> bytes:
    return b"event: " + name + b"\ndata: " + _ENCODE(obj) + b"\n\n"


_DELTA = (
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":%d,"delta":{"type":"%b","%b":%b}}\n\n'
)
_PING = b'event: ping\ndata: {"type":"ping"}\n\n'
_STOP = b'event: content_block_stop\ndata: {"type":"content_block_stop","index":%d}\n\n'


class SseSink:
    """Block operations as Anthropic's SSE events, added to the stream (sent by its flushes)."""

    __slots__ = ("_out",)

    def __init__(self, out: SseStream) -> None:
        self._out = out

    def _start(self, index: int, block: dict[str, Any]) -> None:
        self._out.add(
            _event(b"content_block_start", {"type": "content_block_start", "index": index, "content_block": block})
        )

    def start_text(self, index: int) -> None:
        self._start(index, {"type": "text", "text": ""})

    def text(self, index: int, text: str) -> None:
        self._out.add(_DELTA % (index, b"text_delta", b"text", _ENCODE(text)))

    def start_thinking(self, index: int) -> None:
        self._start(index, {"type": "thinking", "thinking": "", "signature": ""})

    def thinking(self, index: int, text: str) -> None:
        self._out.add(_DELTA % (index, b"thinking_delta", b"thinking", _ENCODE(text)))

    def signature(self, index: int, sig: str) -> None:
        self._out.add(_DELTA % (index, b"signature_delta", b"signature", _ENCODE(sig)))

    def start_tool(self, index: int, tool_id: str, name: str) -> None:
        self._start(index, {"type": "tool_use", "id": tool_id, "name": name, "input": {}})

    def input_json(self, index: int, partial: str) -> None:
        self._out.add(_DELTA % (index, b"input_json_delta", b"partial_json", _ENCODE(partial)))

    def stop(self, index: int) -> None:
        self._out.add(_STOP % index)


class _Pinger:
    """Sends ``ping`` when the stream has been idle for PING_INTERVAL_S (a task owned by one stream)."""

    def __init__(self, out: SseStream) -> None:
        self._out = out
        self.writes = 0

    async def run(self) -> None:
        seen = -1
        while True:
            await asyncio.sleep(PING_INTERVAL_S)
            if self.writes == seen:
                self._out.add(_PING)
                await self._out.flush()
            seen = self.writes


class Messages:
    """The adapter: ``/v1/messages`` and ``/v1/messages/count_tokens``."""

    envelope = ANTHROPIC

    def __init__(self, env: AdapterEnv) -> None:
        self._pipeline = env.pipeline
        self._max_body = env.max_body_bytes

    def routes(self) -> list[Route]:
        return [
            Route("POST", "/v1/messages", self.create),
            Route("POST", "/v1/messages/count_tokens", self.count_tokens),
        ]

    async def count_tokens(self, request: web.Request) -> web.Response:
        """{"input_tokens": the prompt's tokens exactly as the template and tokenizer make them}."""
        _check_headers(request)
        req = await read_json(request, CountTokensRequest, self._max_body)
        _check_limits(req, request)
        model = self._pipeline.model(req.model)
        prompt, tools, _ = chat_prompt(req, None)
        neutral = GenerateRequest(model=req.model, prompts=(prompt,), sampling=Sampling(), tools=tools)
        prepared = await self._pipeline.prepare(neutral, model, context_of(request), request_id="count_tokens")
        body = {"input_tokens": len(prepared.prompts[0].ids)}
        return web.Response(body=_ENCODE(body), content_type="application/json")

    async def create(self, request: web.Request) -> web.StreamResponse:
        _check_headers(request)
        ctx = context_of(request)
        req = await read_json(request, MessagesRequest, self._max_body)
        _check_limits(req, request)
        pipeline = self._pipeline
        model = pipeline.model(req.model)
        neutral = messages_request(req)
        rid = "msg_" + random_hex()
        prepared = await pipeline.prepare(neutral, model, ctx, request_id=rid)
        run = pipeline.run(prepared, ctx)
        if req.stream:
            return await self._stream(request, run, rid, model.name)
        return await self._complete(run, rid, model.name)

    async def _complete(self, run: Run, rid: str, model: str) -> web.Response:
        sink = MessageSink()
        blocks = Blocks(sink)
        finish: Finish | None = None
        usage = run.usage
        async with contextlib.aclosing(run.events()) as events:
            async for batch in events:
                f, u = _feed(blocks, batch)
                finish = f or finish
                usage = u or usage
        blocks.close()
        reason, sequence = stop_reason(finish, blocks.tool_calls)
        body = {
            "id": rid,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": sink.content,
            "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": usage_object(usage),
        }
        return web.Response(body=_ENCODE(body), content_type="application/json")

    async def _stream(self, request: web.Request, run: Run, rid: str, model: str) -> web.StreamResponse:
        async with contextlib.aclosing(run.events()) as events:
            # The first batch is awaited before the 200 goes out: no healthy worker, or a worker that cannot
            # be reached, is a plain HTTP error in Anthropic's envelope, not a broken stream.
            first = await anext(events, None)
            resp = await open_stream(request)  # writes wait for a slow reader (node/http/sse.py)
            out = SseStream(resp)
            usage = run.usage
            start: dict[str, Any] = {
                "id": rid,
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {**usage_object(usage), "output_tokens": 0},
            }
            out.add(_event(b"message_start", {"type": "message_start", "message": start}))
            out.add(_PING)
            blocks = Blocks(SseSink(out))
            finish: Finish | None = None
            pinger = _Pinger(out)
            ping = asyncio.create_task(pinger.run(), name=f"ping-{rid}")
            try:
                batch = first
                while batch is not None:
                    f, u = _feed(blocks, batch)
                    finish = f or finish
                    usage = u or usage
                    pinger.writes += 1
                    await out.flush()
                    batch = await anext(events, None)
            except GatewayError as exc:
                ping.cancel()
                await asyncio.gather(ping, return_exceptions=True)
                await out.close(_event(b"error", error_object(exc.status, exc.message)))
                return resp
            finally:
                ping.cancel()
                await asyncio.gather(ping, return_exceptions=True)
        blocks.close()
        reason, sequence = stop_reason(finish, blocks.tool_calls)
        out.add(
            _event(
                b"message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": reason, "stop_sequence": sequence},
                    "usage": usage_object(usage),
                },
            )
        )
        await out.close(b'event: message_stop\ndata: {"type":"message_stop"}\n\n')
        return resp
