"""Bounds on what one request can make the node hold, checked once where the body is decoded (`read_json`).

Every bound is a field of `node.config.RequestLimits` (a CLI flag / env var / YAML key like any config; the
class lives in the config leaf) and a request past one is a 400 in OpenAI's envelope naming the field and the
limit. Fixed wire ranges (the engine's int32/uint32 fields) are msgspec constraints on the request types
instead; the body size is `HttpConfig.max_body_bytes`.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sized
from typing import Any

import msgspec

from node.config import RequestLimits
from node.errors import InvalidRequest, PayloadTooLarge, UnsupportedEncoding
from node.http.openai_types import ChatCompletionRequest, CompletionRequest, SamplingFields
from node.http.responses_types import ConversationCreateRequest, ItemsCreateRequest, ResponsesRequest

# Output of one inflate step: small against any body limit, large enough that the steps cost nothing.
_INFLATE_STEP_BYTES = 1 << 20


def _over(param: str, what: str, value: int, limit: int, name: str, *, unit: str = "") -> InvalidRequest:
    return InvalidRequest(
        f"'{param}' {what} {value}{unit}, more than this server's limit of {limit}{unit} ({name}).",
        param=param,
        code=name,
    )


def _count(param: str, items: Sized | None, limit: int, name: str) -> None:
    if items is not None and len(items) > limit:
        raise _over(param, "holds", len(items), limit, name)


def _depth(param: str, value: Any, limit: int) -> None:
    """Raise when ``value`` nests lists/objects deeper than ``limit`` (iterative: no recursion of our own)."""
    if value is None:  # the usual case: an optional field not sent
        return
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        children: Iterable[Any]
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, list | tuple):
            children = node
        elif isinstance(node, msgspec.Struct):
            children = msgspec.structs.astuple(node)
        else:
            continue
        if depth > limit:
            raise InvalidRequest(
                f"'{param}' nests deeper than this server's limit of {limit} levels (max_json_depth).",
                param=param,
                code="max_json_depth",
            )
        stack.extend((child, depth + 1) for child in children)


def _stops(req: SamplingFields, limits: RequestLimits) -> None:
    stops = [req.stop] if isinstance(req.stop, str) else req.stop or []
    _count("stop", stops, limits.max_stop_strings, "max_stop_strings")
    total = 0
    for i, stop in enumerate(stops):
        param = "stop" if isinstance(req.stop, str) else f"stop[{i}]"
        if len(stop) > limits.max_stop_chars:
            raise _over(param, "has", len(stop), limits.max_stop_chars, "max_stop_chars")
        total += len(stop)
    if total > limits.max_stop_chars_total:
        raise _over("stop", "totals", total, limits.max_stop_chars_total, "max_stop_chars_total")


def _sampling(
    req: SamplingFields, limits: RequestLimits, *, choices: int, max_tokens: int | None, param: str, logprobs: bool
) -> None:
    """n, stops, and ``choices`` x ``max_tokens`` (an omitted max_tokens is capped by `output_cap` instead)."""
    if req.n > limits.max_n:
        raise _over("n", "is", req.n, limits.max_n, "max_n")
    _stops(req, limits)
    _count("stop_token_ids", req.stop_token_ids, limits.max_stop_strings, "max_stop_strings")
    if max_tokens is not None:
        name = "max_logprob_tokens_total" if logprobs else "max_output_tokens_total"
        limit = limits.max_logprob_tokens_total if logprobs else limits.max_output_tokens_total
        if choices * max_tokens > limit:
            raise InvalidRequest(
                f"'{param}' of {max_tokens} for {choices} choice(s) asks for {choices * max_tokens} tokens, more "
                f"than this server's limit of {limit} ({name}).",
                param=param,
                code=name,
            )


def _constraints(req: SamplingFields, limits: RequestLimits) -> None:
    """Structured-output fields: nested JSON (schemas) walked later, so bounded in depth here first."""
    for name in ("response_format", "structured_outputs", "guided_json", "guided_choice"):
        _depth(name, getattr(req, name), limits.max_json_depth)


def _tools(param: str, tools: list[Any] | None, limits: RequestLimits) -> None:
    if not tools:
        return
    _count(param, tools, limits.max_tools, "max_tools")
    _depth(param, tools, limits.max_json_depth)  # first: a deep value would overflow the encoder below
    size = len(msgspec.json.encode(tools))
    if size > limits.max_tools_bytes:
        raise _over(param, "takes", size, limits.max_tools_bytes, "max_tools_bytes", unit=" bytes of JSON")


def _chat(req: ChatCompletionRequest, limits: RequestLimits) -> None:
    requested: int | None
    if req.max_completion_tokens is not None:
        requested, param = req.max_completion_tokens, "max_completion_tokens"
    else:
        requested, param = req.max_tokens, "max_tokens"
    _sampling(req, limits, choices=req.n, max_tokens=requested, param=param, logprobs=req.logprobs)
    _constraints(req, limits)
    if req.top_logprobs is not None and req.top_logprobs > limits.max_top_logprobs:
        raise _over("top_logprobs", "is", req.top_logprobs, limits.max_top_logprobs, "max_top_logprobs")
    _count("messages", req.messages, limits.max_messages, "max_messages")
    max_parts, max_calls = limits.max_content_parts, limits.max_tools
    for i, msg in enumerate(req.messages):
        # The parameter's name is only built for the error: this runs per message of every request.
        if isinstance(msg.content, list) and len(msg.content) > max_parts:
            _count(f"messages[{i}].content", msg.content, max_parts, "max_content_parts")
        if msg.tool_calls is not None and len(msg.tool_calls) > max_calls:
            _count(f"messages[{i}].tool_calls", msg.tool_calls, max_calls, "max_tools")
    _tools("tools", req.tools, limits)
    _depth("tool_choice", req.tool_choice, limits.max_json_depth)
    _depth("chat_template_kwargs", req.chat_template_kwargs, limits.max_json_depth)


def _completion(req: CompletionRequest, limits: RequestLimits) -> None:
    prompts = len(req.prompt) if isinstance(req.prompt, list) and req.prompt and not _is_ids(req.prompt) else 1
    if prompts > limits.max_prompts:
        raise _over("prompt", "holds", prompts, limits.max_prompts, "max_prompts")
    _sampling(
        req,
        limits,
        choices=req.n * prompts,
        max_tokens=req.max_tokens,
        param="max_tokens",
        logprobs=req.logprobs is not None,  # 0 too: the sampled token's logprob
    )
    if req.logprobs is not None and req.logprobs > limits.max_top_logprobs:
        raise _over("logprobs", "is", req.logprobs, limits.max_top_logprobs, "max_top_logprobs")
    _constraints(req, limits)
    _depth("prompt", req.prompt, limits.max_json_depth)  # the shape itself is checked by the endpoint


def _is_ids(prompt: list[Any]) -> bool:
    """A single token-id prompt ([1, 2, 3]) rather than a batch."""
    return isinstance(prompt[0], int)


def _items(param: str, items: list[Any] | None, limits: RequestLimits) -> None:
    _count(param, items, limits.max_messages, "max_messages")
    for i, item in enumerate(items or ()):
        content = item.get("content") if isinstance(item, dict) else None
        _count(
            f"{param}[{i}].content",
            content if isinstance(content, list) else None,
            limits.max_content_parts,
            "max_content_parts",
        )
    _depth(param, items, limits.max_json_depth)


def _responses(req: ResponsesRequest, limits: RequestLimits) -> None:
    _sampling(req, limits, choices=req.n, max_tokens=req.max_output_tokens, param="max_output_tokens", logprobs=False)
    _constraints(req, limits)
    _depth("text", req.text, limits.max_json_depth)
    if isinstance(req.input, list):
        _items("input", req.input, limits)
    _tools("tools", req.tools, limits)
    _depth("tool_choice", req.tool_choice, limits.max_json_depth)
    _depth("chat_template_kwargs", req.chat_template_kwargs, limits.max_json_depth)


def inflate(body: bytes, encoding: str, max_bytes: int) -> bytearray:
    """Decompress a request body (``Content-Encoding``: gzip, x-gzip or deflate), never past ``max_bytes``
    of output: the work and memory are bounded by the limit, not by the compression ratio (a 1 MB gzip body
    can inflate to 1 GiB). CPU-bound: callers run it off the event loop.

    Raises PayloadTooLarge (413), InvalidRequest (400, corrupt data), UnsupportedEncoding (415)."""
    if encoding in ("gzip", "x-gzip"):
        wbits = 16 + zlib.MAX_WBITS
    elif encoding == "deflate":
        # RFC 9110 deflate is zlib-wrapped; some clients send raw deflate (aiohttp accepts both, so do we).
        wbits = zlib.MAX_WBITS if body[:1] and body[0] & 0x0F == 8 else -zlib.MAX_WBITS
    else:
        raise UnsupportedEncoding(
            f"Content-Encoding {encoding!r} is not supported; send identity, gzip or deflate.", param=None
        )
    # Inflated in steps into one growing buffer: the peak is the output plus one step, never twice the output.
    out = bytearray()
    rest = body
    try:
        while rest:  # a gzip body may hold several members, one after another
            inflater = zlib.decompressobj(wbits)
            pending = rest
            while not inflater.eof:
                chunk = inflater.decompress(pending, _INFLATE_STEP_BYTES)
                out += chunk
                if len(out) > max_bytes:
                    raise PayloadTooLarge(f"Request body inflates to more than the limit of {max_bytes} bytes.")
                pending = inflater.unconsumed_tail
                if not pending and not chunk:
                    raise InvalidRequest(f"The {encoding} request body is truncated.")
            rest = inflater.unused_data
    except zlib.error as exc:
        raise InvalidRequest(f"The request body is not valid {encoding} data ({exc}).") from exc
    return out


def check_request(body: object, limits: RequestLimits) -> None:
    """Check a decoded request body against ``limits``. Raises InvalidRequest (400) naming the field and limit."""
    if isinstance(body, ChatCompletionRequest):
        _chat(body, limits)
    elif isinstance(body, CompletionRequest):
        _completion(body, limits)
    elif isinstance(body, ResponsesRequest):
        _responses(body, limits)
    elif isinstance(body, ConversationCreateRequest | ItemsCreateRequest):
        _items("items", body.items, limits)
