"""Closed-loop streaming chat-completions load generator (aiohttp, one process, one event loop).

``concurrency`` users each send a request, read its SSE stream to the end and send the next one, until
``duration_s`` has passed (requests in flight then finish). Every request asks for exactly ``max_tokens``
tokens (``ignore_eos``) and the usage chunk (``stream_options.include_usage``), which is how token counts are
verified.

The stream is parsed minimally so the generator is not the bottleneck: JSON is decoded only for the few
events up to the first content delta (TTFT) and for the final usage chunk, found in a short tail buffer; the
events in between are only received. The generator measures its own CPU time so the report can show it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import aiohttp
import msgspec

from bench.prompts import PromptPool

T = TypeVar("T")

# Bytes of the stream's end kept to find the usage chunk and [DONE]; a usage chunk is ~300 bytes.
TAIL_BYTES = 4096
# A point gives up after this many failed requests: something is broken, more samples add nothing.
MAX_ERRORS = 20
# Error messages kept for the report.
KEPT_ERRORS = 5
DONE = b"data: [DONE]"


class LoadError(Exception):
    """A request failed: bad status, a malformed or incomplete stream, or an error event."""


class _Delta(msgspec.Struct):
    content: str | None = None
    # A thinking model's first tokens are reasoning (vLLM/DeepSeek's field, which both gateways stream): the
    # first token a user sees, so TTFT counts it as it counts content.
    reasoning_content: str | None = None


class _Choice(msgspec.Struct):
    delta: _Delta | None = None


class _PromptDetails(msgspec.Struct):
    cached_tokens: int = 0


class _Usage(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # The engine's prefix-cache hit, passed through by both gateways (OpenAI's usage.prompt_tokens_details).
    prompt_tokens_details: _PromptDetails | None = None

    @property
    def cached_tokens(self) -> int:
        return 0 if self.prompt_tokens_details is None else self.prompt_tokens_details.cached_tokens


class _Chunk(msgspec.Struct):
    choices: list[_Choice] = field(default_factory=list)
    usage: _Usage | None = None
    error: object | None = None


_decode_chunk = msgspec.json.Decoder(_Chunk).decode
_encode = msgspec.json.encode


@dataclass(frozen=True, slots=True)
class ChatLoad:
    """One load point against one gateway."""

    base_url: str
    model: str
    pool: PromptPool
    max_tokens: int
    concurrency: int
    duration_s: float
    first_number: int  # request numbers (prompt prefixes) start here: distinct across a whole run
    max_requests: int = 0  # 0: only the duration bounds the point
    request_timeout_s: float = 120.0
    api: str = "chat"  # "chat": /v1/chat/completions; "messages": Anthropic's /v1/messages
    headers: tuple[tuple[str, str], ...] = ()  # sent with every request (credentials, say)


@dataclass(frozen=True, slots=True)
class Sample:
    ttft_s: float
    latency_s: float
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # usage.prompt_tokens_details.cached_tokens (0 when the gateway omits it)


@dataclass(frozen=True, slots=True)
class LoadResult:
    samples: tuple[Sample, ...]
    error_count: int
    errors: tuple[str, ...]  # the first few messages
    wall_s: float  # first request sent to last response finished
    loadgen_cpu_s: float  # this process's CPU over the point
    next_number: int


def request_body(model: str, text: str, max_tokens: int) -> bytes:
    return _encode(
        {
            "model": model,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )


def messages_body(model: str, text: str, max_tokens: int) -> bytes:
    """An Anthropic Messages request. The API has no ignore_eos: the worker is started with EOS far away
    (gateway_bench's ``MESSAGES_SIM_FLAGS``) so every answer is ``max_tokens`` long too."""
    return _encode(
        {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, "stream": True}
    )


def _data_of(data: bytes, event: bytes) -> dict[str, object]:
    """The data of the last complete ``event`` in ``data``. Raises LoadError when there is none."""
    at = data.rfind(b"event: " + event + b"\ndata: ")
    end = data.find(b"\n", at + len(event) + 15) if at >= 0 else -1
    if at < 0 or end < 0:
        raise LoadError(f"no {event.decode()} event: ...{data[-300:]!r}")
    value = msgspec.json.decode(data[at + len(event) + 14 : end])
    if not isinstance(value, dict):
        raise LoadError(f"bad {event.decode()} event")
    return value


async def stream_messages(
    session: aiohttp.ClientSession, url: str, body: bytes, extra: dict[str, str] | None = None
) -> Sample:
    """One streaming Anthropic Messages request (with ``extra`` headers, which override the default
    ``x-api-key``) read to the end (TTFT: the first text_delta).

    Raises:
        LoadError: non-200 status, an error event or a malformed stream.
        aiohttp.ClientError, TimeoutError: transport failures.
    """
    start = time.perf_counter()
    first = 0.0
    head = b""
    tail = b""
    headers = {
        "Content-Type": "application/json",
        "anthropic-version": "2023-06-01",
        "x-api-key": "bench",
        **(extra or {}),
    }
    async with session.post(url, data=body, headers=headers) as response:
        if response.status != 200:
            raise LoadError(f"HTTP {response.status}: {(await response.text())[:300]}")
        async for chunk in response.content.iter_any():
            if not first:
                head += chunk
                if b'"text_delta"' in head:
                    first = time.perf_counter()
            tail = chunk[-TAIL_BYTES:] if len(chunk) >= TAIL_BYTES else (tail + chunk)[-TAIL_BYTES:]
    end = time.perf_counter()
    if b"event: error" in tail or not tail.rstrip().endswith(b'"message_stop"}'):
        raise LoadError(f"stream did not end with message_stop: ...{tail[-300:]!r}")
    if not first:
        raise LoadError(f"no text delta in the stream: {head[:300]!r}")
    message = _data_of(head, b"message_start").get("message")
    start_usage = message.get("usage") if isinstance(message, dict) else None
    usage = _data_of(tail, b"message_delta").get("usage")
    if not isinstance(start_usage, dict) or not isinstance(usage, dict):
        raise LoadError("no usage in message_start / message_delta")
    cached = int(start_usage.get("cache_read_input_tokens") or 0)
    return Sample(
        ttft_s=first - start,
        latency_s=end - start,
        prompt_tokens=int(start_usage.get("input_tokens") or 0) + cached,
        completion_tokens=int(usage.get("output_tokens") or 0),
        cached_tokens=cached,
    )


def _events(data: bytes) -> list[bytes]:
    """Payloads of the complete ``data:`` events in ``data`` (a trailing partial event is left out)."""
    return [
        line[5:].strip()
        for event in data.split(b"\n\n")[:-1]
        for line in event.split(b"\n")
        if line.startswith(b"data:")
    ]


def has_content(data: bytes) -> bool:
    """Whether the complete events in ``data`` include a non-empty content or reasoning delta.

    Raises:
        LoadError: an event is an error object or not JSON.
    """
    for payload in _events(data):
        if payload == b"[DONE]":
            continue
        chunk = _parse(payload)
        for choice in chunk.choices:
            if choice.delta is not None and (choice.delta.content or choice.delta.reasoning_content):
                return True
    return False


def final_usage(tail: bytes) -> _Usage:
    """The usage object of the stream's last usage chunk, found in its tail.

    Raises:
        LoadError: the stream did not end with [DONE] or carried no usage chunk.
    """
    if not tail.rstrip().endswith(DONE):
        raise LoadError(f"stream did not end with [DONE]: ...{tail[-200:]!r}")
    at = tail.rfind(b'"usage":{')
    if at < 0:
        raise LoadError(f"no usage chunk: ...{tail[-300:]!r}")
    start = tail.rfind(b"data:", 0, at)
    end = tail.find(b"\n", at)
    if start < 0 or end < 0:
        raise LoadError(f"usage chunk cut off: ...{tail[-300:]!r}")
    usage = _parse(tail[start + 5 : end].strip()).usage
    if usage is None:
        raise LoadError("usage chunk without usage")
    return usage


def _parse(payload: bytes) -> _Chunk:
    try:
        chunk = _decode_chunk(payload)
    except msgspec.DecodeError as exc:
        raise LoadError(f"bad event {payload[:200]!r}") from exc
    if chunk.error is not None:
        raise LoadError(f"error event {payload[:300]!r}")
    return chunk


async def stream_chat(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str] | None = None
) -> Sample:
    """Send one streaming chat request (with extra ``headers``, if any) and read it to the end.

    Raises:
        LoadError: non-200 status or a malformed stream.
        aiohttp.ClientError, TimeoutError: transport failures.
    """
    start = time.perf_counter()
    first = 0.0
    head = b""
    tail = b""
    sent_headers = {"Content-Type": "application/json", **(headers or {})}
    async with session.post(url, data=body, headers=sent_headers) as response:
        if response.status != 200:
            text = await response.text()
            raise LoadError(f"HTTP {response.status}: {text[:300]}")
        async for chunk in response.content.iter_any():
            if not first:
                head += chunk
                if has_content(head):
                    first = time.perf_counter()
            tail = chunk[-TAIL_BYTES:] if len(chunk) >= TAIL_BYTES else (tail + chunk)[-TAIL_BYTES:]
    end = time.perf_counter()
    if not first:
        raise LoadError(f"no content or reasoning delta in the stream: {head[:300]!r}")
    usage = final_usage(tail)
    return Sample(
        ttft_s=first - start,
        latency_s=end - start,
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        cached_tokens=usage.cached_tokens,
    )


async def _run_point(load: ChatLoad) -> LoadResult:
    messages = load.api == "messages"
    url = load.base_url.rstrip("/") + ("/v1/messages" if messages else "/v1/chat/completions")
    make_body = messages_body if messages else request_body
    headers = dict(load.headers)
    samples: list[Sample] = []
    errors: list[str] = []
    error_count = 0
    number = load.first_number
    cpu0 = time.process_time()
    start = time.perf_counter()
    deadline = start + load.duration_s

    def more() -> bool:
        issued = number - load.first_number
        return (
            time.perf_counter() < deadline
            and (load.max_requests <= 0 or issued < load.max_requests)
            and error_count < MAX_ERRORS
        )

    async def user(session: aiohttp.ClientSession) -> None:
        nonlocal number, error_count
        while more():
            body = make_body(load.model, load.pool.text(number), load.max_tokens)
            number += 1
            try:
                sample = await (
                    stream_messages(session, url, body, headers)
                    if messages
                    else stream_chat(session, url, body, headers)
                )
                samples.append(sample)
            except (LoadError, aiohttp.ClientError, TimeoutError) as exc:
                error_count += 1
                if len(errors) < KEPT_ERRORS:
                    errors.append(f"{type(exc).__name__}: {exc}")

    connector = aiohttp.TCPConnector(limit=load.concurrency, limit_per_host=load.concurrency)
    timeout = aiohttp.ClientTimeout(total=load.request_timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        users = [user(session) for _ in range(load.concurrency)]
        # Each request is bounded by its own timeout; this bounds the point as a whole.
        await asyncio.wait_for(asyncio.gather(*users), load.duration_s + load.request_timeout_s + 5.0)
    wall = time.perf_counter() - start
    return LoadResult(
        samples=tuple(samples),
        error_count=error_count,
        errors=tuple(errors),
        wall_s=wall,
        loadgen_cpu_s=time.process_time() - cpu0,
        next_number=number,
    )


async def _get_models(base_url: str, timeout_s: float, headers: dict[str, str]) -> list[str]:
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.get(base_url.rstrip("/") + "/v1/models", headers=headers) as response,
    ):
        if response.status != 200:
            return []
        payload = await response.json()
    data = payload.get("data") if isinstance(payload, dict) else None
    return [str(item["id"]) for item in data or () if isinstance(item, dict) and "id" in item]


def run_async(coro_fn: Callable[[], Awaitable[T]]) -> T:
    """Run ``coro_fn()`` to completion on a fresh event loop (uvloop when installed)."""

    async def main() -> T:
        return await coro_fn()

    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop comes with smg-node on Linux
        return asyncio.run(main())
    return uvloop.run(main())


def run_point(load: ChatLoad) -> LoadResult:
    """Run one load point on a fresh event loop (uvloop when installed) and return its samples."""
    return run_async(lambda: _run_point(load))


def run_points(loads: Sequence[ChatLoad]) -> list[LoadResult]:
    """Run several load points at once on one fresh event loop (one per gateway of a cluster, say)."""

    async def together() -> list[LoadResult]:
        return list(await asyncio.gather(*(_run_point(load) for load in loads)))

    return run_async(together)


def served_models(base_url: str, timeout_s: float = 2.0, headers: Sequence[tuple[str, str]] = ()) -> list[str]:
    """Model ids the gateway lists at /v1/models (asked with ``headers``); empty while it is not ready, is
    unreachable, or refuses the credentials."""
    try:
        return run_async(lambda: _get_models(base_url, timeout_s, dict(headers)))
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return []
