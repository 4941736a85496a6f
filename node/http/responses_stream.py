"""Server-sent events of a streamed Responses API answer, as OpenAI frames them: `event: <type>` then
`data: <json>` whose `type` repeats the event name, every event numbered by `sequence_number` from 0.

The sequence for one text answer:
response.created, response.in_progress, response.output_item.added, response.content_part.added,
response.output_text.delta ..., response.output_text.done, response.content_part.done,
response.output_item.done, then one terminal event: response.completed (or response.incomplete when the
token budget ran out, response.failed on an error). There is no `[DONE]` sentinel.

Pure: bytes out, no I/O. Delta frames are the hot path and are built from a precomputed byte template.
"""

from __future__ import annotations

from typing import Any

import msgspec

_ENCODE = msgspec.json.Encoder().encode

TERMINAL_EVENTS = ("response.completed", "response.incomplete", "response.failed")


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": []}


class ResponseEvents:
    """Frames for one response with one message item (output_index 0, content_index 0)."""

    __slots__ = ("_delta_head", "_item_id", "_seq")

    def __init__(self, item_id: str) -> None:
        self._item_id = item_id
        self._seq = 0
        self._delta_head = (
            b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","item_id":'
            + _ENCODE(item_id)
            + b',"output_index":0,"content_index":0,"logprobs":[],"sequence_number":'
        )

    @property
    def sent(self) -> int:
        """How many events were framed so far."""
        return self._seq

    def _next(self) -> int:
        seq = self._seq
        self._seq += 1
        return seq

    def event(self, kind: str, fields: dict[str, Any]) -> bytes:
        body = {"type": kind, "sequence_number": self._next(), **fields}
        return b"event: " + kind.encode() + b"\ndata: " + _ENCODE(body) + b"\n\n"

    def response(self, kind: str, response: dict[str, Any]) -> bytes:
        """response.created / in_progress / completed / incomplete / failed, carrying the whole object."""
        return self.event(kind, {"response": response})

    def item_added(self, item: dict[str, Any]) -> bytes:
        return self.event("response.output_item.added", {"output_index": 0, "item": item})

    def part_added(self) -> bytes:
        return self.event(
            "response.content_part.added",
            {"item_id": self._item_id, "output_index": 0, "content_index": 0, "part": _text_part("")},
        )

    def delta(self, text: str) -> bytes:
        return self._delta_head + b'%d,"delta":%b}\n\n' % (self._next(), _ENCODE(text))

    def text_done(self, text: str) -> bytes:
        return self.event(
            "response.output_text.done",
            {"item_id": self._item_id, "output_index": 0, "content_index": 0, "text": text, "logprobs": []},
        )

    def part_done(self, text: str) -> bytes:
        return self.event(
            "response.content_part.done",
            {"item_id": self._item_id, "output_index": 0, "content_index": 0, "part": _text_part(text)},
        )

    def item_done(self, item: dict[str, Any]) -> bytes:
        return self.event("response.output_item.done", {"output_index": 0, "item": item})
