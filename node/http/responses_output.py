"""The output items of one Responses API answer, built from the pipeline's events of its one choice, and
(when streaming) the events that announce them as they grow.

Items appear in the order the model wrote them: a ``reasoning`` item (reasoning text), ``message`` items
(answer text), ``function_call`` items (one per tool call). One item is open at a time; it is closed (its
``done`` events) when text of another kind arrives or the answer ends. An answer with no item at all is one
empty message, as before tools existed.

Pure: frames out (``b""`` when not streaming), no I/O; ids come from the injected factory.
"""

from __future__ import annotations

from typing import Any

from node.http.responses_stream import ResponseEvents
from node.pipeline.events import ContentDelta, Event, ReasoningDelta, ToolCallDelta
from node.pipeline.responses_items import IdFactory

_MESSAGE, _REASONING, _CALL = "message", "reasoning", "function_call"


def output_text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def reasoning_part(text: str) -> dict[str, Any]:
    return {"type": "reasoning_text", "text": text}


class ResponseOutput:
    """Feed the choice's events; ``finish`` once; read ``items`` (the response's output)."""

    def __init__(self, new_id: IdFactory, frames: ResponseEvents | None = None) -> None:
        self._new_id = new_id
        self._frames = frames
        self.items: list[dict[str, Any]] = []
        self.reason: str | None = None
        self._kind: str | None = None  # the open item's kind
        self._item: dict[str, Any] = {}
        self._texts: list[str] = []
        self._call = -1  # the open function_call's call number
        self._head = b""

    def feed(self, ev: Event) -> bytes:
        if type(ev) is ContentDelta:
            if not ev.text:
                return b""
            return self._grow(_MESSAGE, ev.text)
        if type(ev) is ReasoningDelta:
            return self._grow(_REASONING, ev.text) if ev.text else b""
        if type(ev) is ToolCallDelta:
            out = b""
            if ev.name is not None or self._kind != _CALL or ev.call != self._call:
                out += self._open_call(ev)
            return out + (self._append(ev.arguments) if ev.arguments else b"")
        return b""

    def finish(self, reason: str | None) -> bytes:
        """The answer ended (``reason``: the choice's finish reason; "length" leaves the last message
        incomplete)."""
        self.reason = reason
        out = self._close()
        if not self.items:
            self._open(_MESSAGE)
            out += self._close()
        return out

    # --- items ------------------------------------------------------------------------------------------

    def _grow(self, kind: str, text: str) -> bytes:
        out = b"" if self._kind == kind else self._close() + self._open(kind)
        return out + self._append(text)

    def _append(self, text: str) -> bytes:
        self._texts.append(text)
        frames = self._frames
        return frames.delta(self._head, text) if frames is not None else b""

    def _open(self, kind: str) -> bytes:
        item_id = self._new_id("msg" if kind == _MESSAGE else "rs")
        index = len(self.items)
        self._kind = kind
        self._texts = []
        if kind == _MESSAGE:
            self._item = {"id": item_id, "type": _MESSAGE, "status": "in_progress", "role": "assistant", "content": []}
            part = output_text_part("")
            delta = "response.output_text.delta"
        else:
            self._item = {"id": item_id, "type": _REASONING, "summary": [], "content": [], "status": "in_progress"}
            part = reasoning_part("")
            delta = "response.reasoning_text.delta"
        frames = self._frames
        if frames is None:
            return b""
        self._head = frames.delta_head(delta, item_id, index, logprobs=kind == _MESSAGE)
        return frames.event("response.output_item.added", {"output_index": index, "item": self._item}) + frames.event(
            "response.content_part.added", {"item_id": item_id, "output_index": index, "content_index": 0, "part": part}
        )

    def _open_call(self, ev: ToolCallDelta) -> bytes:
        out = self._close()
        index = len(self.items)
        self._kind = _CALL
        self._call = ev.call
        self._texts = []
        self._item = {
            "id": self._new_id("fc"),
            "type": _CALL,
            "status": "in_progress",
            "call_id": ev.id or self._new_id("call"),
            "name": ev.name or "",
            "arguments": "",
        }
        frames = self._frames
        if frames is None:
            return out
        self._head = frames.delta_head("response.function_call_arguments.delta", self._item["id"], index)
        return out + frames.event("response.output_item.added", {"output_index": index, "item": self._item})

    def _close(self) -> bytes:
        kind = self._kind
        if kind is None:
            return b""
        text = "".join(self._texts)
        index = len(self.items)
        item = dict(self._item)
        item_id = item["id"]
        frames = self._frames
        out = b""
        if kind == _CALL:
            # A call open when the token budget ran out was cut there (its arguments are what was sent).
            item.update(status="incomplete" if self.reason == "length" else "completed", arguments=text)
            if frames is not None:
                out = frames.event(
                    "response.function_call_arguments.done",
                    {"item_id": item_id, "output_index": index, "name": item["name"], "arguments": text},
                )
        else:
            message = kind == _MESSAGE
            part = output_text_part(text) if message else reasoning_part(text)
            # Only the answer's last item can be cut short by the token budget.
            cut = message and self.reason == "length"
            item.update(status="incomplete" if cut else "completed", content=[part])
            if frames is not None:
                at = {"item_id": item_id, "output_index": index, "content_index": 0}
                done = "response.output_text.done" if message else "response.reasoning_text.done"
                out = frames.event(done, {**at, "text": text, **({"logprobs": []} if message else {})})
                out += frames.event("response.content_part.done", {**at, "part": part})
        if frames is not None:
            out += frames.event("response.output_item.done", {"output_index": index, "item": item})
        self.items.append(item)
        self._kind = None
        return out
