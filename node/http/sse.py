"""Server-sent events as OpenAI streams them: `data: <json>\\n\\n` frames, ending with `data: [DONE]`.

Content frames are the hot path (one per token or chunk): they are built from precomputed byte prefixes and a
JSON-encoded string, without building a dict per token. `SseStream` sends the frames that are ready together
in one transport write (each write is a send syscall, on loopback also the receiver's TCP path).
"""

from __future__ import annotations

from typing import Any, Protocol

import msgspec
from aiohttp import hdrs, web
from aiohttp.abc import AbstractStreamWriter

from node.pipeline.events import Event, Usage

_ENCODE = msgspec.json.Encoder().encode

DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",  # proxies must not buffer a token stream
}


def frame(obj: Any) -> bytes:
    return b"data: " + _ENCODE(obj) + b"\n\n"


class BodyWriter(Protocol):
    """The slice of `web.StreamResponse` a stream writes through (after `prepare`)."""

    async def write(self, data: bytes) -> None: ...

    async def write_eof(self, data: bytes = b"") -> None: ...

    def can_write_now(self) -> bool: ...

    def write_now(self, data: bytes) -> None: ...


class SseStream:
    """Frames of one response, sent with as few writes as latency allows.

    Invariants: bytes go out in the order they were added, exactly as one write per frame would send them;
    nothing added is held back waiting for frames still to come: the caller `flush`es once it has added what
    is ready now (one write for all of it), except when it knows the stream is over, where `close` sends the
    rest, the final frames and the end of the body (the chunked terminator) in one write.

    ``write`` raises ConnectionResetError (aiohttp's ClientConnectionResetError) once the client is gone;
    the caller lets it propagate, which closes the generation and aborts the worker request.
    """

    __slots__ = ("_pending", "_resp")

    def __init__(self, resp: BodyWriter) -> None:
        self._resp = resp
        self._pending: list[bytes] = []

    def add(self, frame_bytes: bytes) -> None:
        self._pending.append(frame_bytes)

    async def flush(self) -> None:
        """Write everything added since the last write (nothing if nothing was)."""
        pending = self._pending
        if not pending:
            return
        data = pending[0] if len(pending) == 1 else b"".join(pending)
        pending.clear()
        await self._resp.write(data)

    def ready(self) -> bool:
        """``send_now`` can send: the body started and the client keeps up (nothing to wait for)."""
        return self._resp.can_write_now()

    def send_now(self) -> None:
        """``flush`` without waiting, after ``ready`` said yes (the push path: node/pipeline/events.py)."""
        pending = self._pending
        if not pending:
            return
        data = pending[0] if len(pending) == 1 else b"".join(pending)
        pending.clear()
        self._resp.write_now(data)

    async def close(self, tail: bytes = DONE) -> None:
        """Write what is pending, then ``tail``, and end the body: one write."""
        pending = self._pending
        pending.append(tail)
        data = b"".join(pending)
        pending.clear()
        await self._resp.write_eof(data)


class SseSink:
    """One stream's rendering state, an ``EventSink`` (node/pipeline/events.py): the handler's loop renders
    what it reads (``render``, the adapter's), and the push path hands it the tokens that need no waiting
    (``take``: rendered and sent at once), in order. ``out`` is set once the response is open."""

    __slots__ = ("open_choices", "out", "usage")

    def __init__(self, choices: int, usage: Usage) -> None:
        self.out: SseStream | None = None
        self.open_choices = choices
        self.usage = usage

    def ready(self) -> bool:
        out = self.out
        return out is not None and self.open_choices > 0 and out.ready()

    def take(self, events: list[Event]) -> None:
        self.render(events)
        if self.open_choices:
            self.out.send_now()  # type: ignore[union-attr]  # ready(): open
        # else the last choice ended: its frames leave with the closing write, as in the handler's loop

    def render(self, batch: list[Event]) -> None:
        raise NotImplementedError


class SseResponse(web.StreamResponse):
    """A streamed response whose writes wait while the client is behind.

    After a write that leaves the connection's transport above its high-water mark (the kernel's send buffer
    is full and WRITE_HIGH_WATER_BYTES more wait in ours, node/http/connections.py), the write waits for the
    drain: the handler takes no more tokens from the generation until the client reads. A client that reads
    nothing for the connection's write timeout is disconnected; the write then raises (or the handler is
    cancelled), the generation is closed and the worker request aborted. So a stalled client holds at most the
    high-water mark plus one write, and the worker does not generate for it past the write timeout.
    """

    __slots__ = ("_client", "_drain", "_live", "_plain", "_transport", "_writer")

    # The status line and headers go out with the first frames, in one write (aiohttp buffers them until the
    # first body write, as it does for web.Response): every caller writes right after prepare, so nothing waits
    # on them, and a separate send of ~150 bytes of headers was one system call of ~4 per streamed request.
    _send_headers_immediately = False

    async def prepare(self, request: web.BaseRequest) -> AbstractStreamWriter | None:
        writer = await super().prepare(request)
        self._client = request.protocol
        self._writer = request.writer
        self._drain = self._writer.drain
        self._transport = request.transport
        # write_now frames the body itself: only a plainly chunked one (HTTP/1.1, no compression), and only
        # once a write sent the status line and headers (aiohttp holds them for the first write).
        headers = self.headers
        self._plain = headers.get(hdrs.TRANSFER_ENCODING) == "chunked" and hdrs.CONTENT_ENCODING not in headers
        self._live = False
        return writer

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        await super().write(data)
        self._live = self._plain
        if self._client.writing_paused:
            await self._drain()

    async def write_eof(self, data: bytes = b"") -> None:
        self._live = False
        await super().write_eof(data)

    def can_write_now(self) -> bool:
        """``write_now`` can send: the body is chunked and started, and the client is not behind (a write
        would not wait for the drain)."""
        transport = self._transport
        return self._live and not self._client.writing_paused and transport is not None and not transport.is_closing()

    def write_now(self, data: bytes) -> None:
        """``write`` without waiting, after ``can_write_now`` said yes: one chunk of the body, sent at once
        (what aiohttp's writer sends for it; the connection's pause and write timeout apply as to any write)."""
        chunk = b"%x\r\n%b\r\n" % (len(data), data)
        self._writer.output_size += len(chunk)
        self._transport.write(chunk)  # type: ignore[union-attr]  # can_write_now: not None


async def open_stream(request: web.Request) -> SseResponse:
    resp = SseResponse(status=200, headers=SSE_HEADERS)
    await resp.prepare(request)
    return resp


class ChunkFrames:
    """Frames for one streamed response: every chunk shares id, object, created, model (and usage: null when
    the client asked for a usage chunk, as OpenAI sends it)."""

    def __init__(self, *, response_id: str, obj: str, created: int, model: str, include_usage: bool) -> None:
        head = {"id": response_id, "object": obj, "created": created, "model": model}
        self._head = _ENCODE(head)[:-1]  # the object without its closing brace
        self._usage_tail = b',"usage":null}' if include_usage else b"}"

    def choices(self, choices_json: bytes) -> bytes:
        return b"data: " + self._head + b',"choices":' + choices_json + self._usage_tail + b"\n\n"

    def chat_content(self, index: int, text: str) -> bytes:
        return self.choices(
            b'[{"index":%d,"delta":{"content":%b},"logprobs":null,"finish_reason":null}]' % (index, _ENCODE(text))
        )

    def completion_text(self, index: int, text: str) -> bytes:
        return self.choices(b'[{"index":%d,"text":%b,"logprobs":null,"finish_reason":null}]' % (index, _ENCODE(text)))

    def with_choice(self, choice: dict[str, Any]) -> bytes:
        return self.choices(_ENCODE([choice]))

    def usage(self, usage: dict[str, Any]) -> bytes:
        return b"data: " + self._head + b',"choices":[],"usage":' + _ENCODE(usage) + b"}\n\n"
