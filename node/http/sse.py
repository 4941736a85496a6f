"""Server-sent events as OpenAI streams them: `data: <json>\\n\\n` frames, ending with `data: [DONE]`.

Content frames are the hot path (one per token or chunk): they are built from precomputed byte prefixes and a
JSON-encoded string, without building a dict per token.
"""

from __future__ import annotations

from typing import Any

import msgspec
from aiohttp import web

_ENCODE = msgspec.json.Encoder().encode

DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",  # proxies must not buffer a token stream
}


def frame(obj: Any) -> bytes:
    return b"data: " + _ENCODE(obj) + b"\n\n"


async def open_stream(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(status=200, headers=SSE_HEADERS)
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
