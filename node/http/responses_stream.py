"""Server-sent events of a streamed Responses API answer, as OpenAI frames them: `event: <type>` then
`data: <json>` whose `type` repeats the event name, every event numbered by `sequence_number` from 0.

The sequence: response.created, response.in_progress, then per output item (in order, each closed before
the next one opens; node/http/responses_output.py decides which):
  reasoning:     output_item.added, content_part.added, reasoning_text.delta ..., reasoning_text.done,
                 content_part.done, output_item.done
  message:       output_item.added, content_part.added, output_text.delta ..., output_text.done,
                 content_part.done, output_item.done
  function_call: output_item.added, function_call_arguments.delta ..., function_call_arguments.done,
                 output_item.done
then one terminal event: response.completed (or response.incomplete when the token budget ran out,
response.failed on an error). There is no `[DONE]` sentinel.

Pure: bytes out, no I/O. Text delta frames are the hot path and are built from a per-item byte template.
"""

from __future__ import annotations

from typing import Any

import msgspec

_ENCODE = msgspec.json.Encoder().encode

TERMINAL_EVENTS = ("response.completed", "response.incomplete", "response.failed")


class ResponseEvents:
    """Numbers and frames the events of one response."""

    __slots__ = ("_seq",)

    def __init__(self) -> None:
        self._seq = 0

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

    @staticmethod
    def delta_head(kind: str, item_id: str, output_index: int, *, logprobs: bool = False) -> bytes:
        """The constant start of one item's delta frames (``kind``: response.output_text.delta, ...)."""
        return (
            b"event: "
            + kind.encode()
            + b'\ndata: {"type":"'
            + kind.encode()
            + b'","item_id":'
            + _ENCODE(item_id)
            + b',"output_index":%d' % output_index
            + (b',"content_index":0' if kind != "response.function_call_arguments.delta" else b"")
            + (b',"logprobs":[]' if logprobs else b"")
            + b',"sequence_number":'
        )

    def delta(self, head: bytes, text: str) -> bytes:
        return head + b'%d,"delta":%b}\n\n' % (self._next(), _ENCODE(text))
