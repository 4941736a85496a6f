"""Content blocks of one Anthropic message, pure: the pipeline's reasoning, content and tool-call deltas in,
block operations (start, delta, stop) out to a sink. The non-streaming answer (``MessageSink``) and the SSE
stream (node/http/anthropic_messages.py) are two sinks over the same assembler, so a streamed message
accumulates to exactly the non-streamed one.

Invariants: blocks are numbered 0, 1, 2, ... in the order the model produced them; one block is open at a
time (a delta of another kind, or of another tool call, closes it); a thinking block closes with its
``signature``; text that follows a thinking or tool_use block starts at its first non-whitespace character
(the separator the model writes after ``</think>`` or between calls is not a block of its own). Chunk
boundaries change nothing: every rule reads the concatenated text, never a chunk.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any, Protocol

import msgspec

from node.http.ids import random_hex

#: Anthropic tool-use ids look like ``toolu_`` + 24 base62 characters; ours are ``toolu_`` + 24 hex digits.
TOOL_ID_HEX_CHARS = 24


def new_tool_id() -> str:
    return "toolu_" + random_hex()[:TOOL_ID_HEX_CHARS]


def signature(thinking: str) -> str:
    """The ``signature`` of a thinking block: a digest of its text (base64 SHA-256). Anthropic's is an
    encrypted attestation; this node keeps no key and is stateless, so it is an integrity digest only, and
    a thinking block passed back is used as given (its signature is not checked)."""
    return base64.b64encode(hashlib.sha256(thinking.encode("utf-8")).digest()).decode("ascii")


class BlockSink(Protocol):
    def start_text(self, index: int) -> None: ...
    def text(self, index: int, text: str) -> None: ...
    def start_thinking(self, index: int) -> None: ...
    def thinking(self, index: int, text: str) -> None: ...
    def signature(self, index: int, sig: str) -> None: ...
    def start_tool(self, index: int, tool_id: str, name: str) -> None: ...
    def input_json(self, index: int, partial: str) -> None: ...
    def stop(self, index: int) -> None: ...


_TEXT, _THINKING, _TOOL = 1, 2, 3


class Blocks:
    """The assembler over one sink. Feed ``text``/``thinking``/``tool`` in order, then ``close``."""

    __slots__ = ("_call", "_index", "_kind", "_sink", "_thought", "tool_calls")

    def __init__(self, sink: BlockSink) -> None:
        self._sink = sink
        self._kind = 0  # the open block's kind; 0: none open
        self._index = -1
        self._call = -1  # the pipeline's call number of the open tool_use block
        self._thought: list[str] = []
        self.tool_calls = 0

    def text(self, text: str) -> None:
        if self._kind == _TEXT:
            if text:
                self._sink.text(self._index, text)
            return
        if self._index >= 0:  # after another block: the separator before the text is dropped
            text = text.lstrip()
        if not text:
            return
        self._open(_TEXT)
        self._sink.start_text(self._index)
        self._sink.text(self._index, text)

    def thinking(self, text: str) -> None:
        if not text:
            return
        if self._kind != _THINKING:
            self._open(_THINKING)
            self._thought = []
            self._sink.start_thinking(self._index)
        self._thought.append(text)
        self._sink.thinking(self._index, text)

    def tool(self, call: int, name: str | None, arguments: str) -> None:
        if self._kind != _TOOL or call != self._call:
            self._open(_TOOL)
            self._call = call
            self.tool_calls += 1
            self._sink.start_tool(self._index, new_tool_id(), name or "")
        if arguments:
            self._sink.input_json(self._index, arguments)

    def close(self) -> None:
        """End the open block (the message is over)."""
        if self._kind == _THINKING:
            self._sink.signature(self._index, signature("".join(self._thought)))
        if self._kind:
            self._sink.stop(self._index)
        self._kind = 0

    def _open(self, kind: int) -> None:
        self.close()
        self._kind = kind
        self._index += 1


def tool_input(raw: str) -> dict[str, Any]:
    """A call's arguments as the ``input`` object (a model that wrote no or invalid JSON: {} and the raw text
    is lost, as Anthropic's input must be an object)."""
    if not raw.strip():
        return {}
    try:
        value = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return {}
    return value if isinstance(value, dict) else {}


class MessageSink:
    """Builds the ``content`` list of a non-streamed message."""

    __slots__ = ("_args", "content")

    def __init__(self) -> None:
        self.content: list[dict[str, Any]] = []
        self._args: list[str] = []

    def start_text(self, index: int) -> None:
        self.content.append({"type": "text", "text": ""})

    def text(self, index: int, text: str) -> None:
        self.content[index]["text"] += text

    def start_thinking(self, index: int) -> None:
        self.content.append({"type": "thinking", "thinking": "", "signature": ""})

    def thinking(self, index: int, text: str) -> None:
        self.content[index]["thinking"] += text

    def signature(self, index: int, sig: str) -> None:
        self.content[index]["signature"] = sig

    def start_tool(self, index: int, tool_id: str, name: str) -> None:
        self.content.append({"type": "tool_use", "id": tool_id, "name": name, "input": {}})
        self._args = []

    def input_json(self, index: int, partial: str) -> None:
        self._args.append(partial)

    def stop(self, index: int) -> None:
        block = self.content[index]
        if block["type"] == "tool_use":
            block["input"] = tool_input("".join(self._args))
