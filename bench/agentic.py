"""The agentic workload of bench/agentic_bench.py: tools, request bodies, the streamed answer read whole, and the
check of each answer against what was offered.

A conversation is two turns (tool call → tool result → answer): turn 1 offers the tools under
``tool_choice: auto``; when the answer calls them, turn 2 sends the calls back as the assistant message, one
``role: tool`` result per call, and expects a plain answer. Each conversation carries its own ``seed``, so the
simulated engine's choice (call, parallel calls or text, as a model under ``auto``) is fixed per conversation
and prompt; a gateway that renders the prompt differently may draw a different choice, which is why calls are
counted against the answers that carried a call, not against the turns.

Every answer is classified by what the client got (``Outcome``): calls whose names and JSON arguments validate
against the offered schemas; calls that do not; no call but the family's call markup in the text (the parser
missed it); plain text. Pure code: no sockets, no clocks.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final

import msgspec

# Offered in every turn: an enum, an integer range and a bounded string, so a malformed or truncated argument
# is caught by the schema and not only by the JSON decoder.
TOOLS: Final[tuple[dict[str, Any], ...]] = (
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather and a forecast for a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "minLength": 1, "maxLength": 40},
                    "days": {"type": "integer", "minimum": 1, "maximum": 7},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city", "days"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search_docs",
            "description": "Search the product documentation.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "minLength": 1, "maxLength": 80},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 20},
                    "exact": {"type": "boolean"},
                },
                "required": ["query"],
                "additionalProperties": False,
            },
        },
    },
)
SYSTEM_PROMPT: Final = "You are a helpful assistant. Use the tools when they help; answer briefly."


def note_tool(chars: int) -> dict[str, Any]:
    """One function whose only argument is a string of exactly ``chars`` characters: a call as long as wanted,
    for the per-token comparison of a call with a plain answer."""
    text = {"type": "string", "minLength": chars, "maxLength": chars}
    return {
        "type": "function",
        "function": {
            "name": "write_note",
            "description": "Save a note.",
            "parameters": {
                "type": "object",
                "properties": {"text": text},
                "required": ["text"],
                "additionalProperties": False,
            },
        },
    }


class Outcome(StrEnum):
    CALL_OK = "call_ok"  # every call names an offered function with arguments that validate
    CALL_BAD = "call_bad"  # a call came back, but a name or its arguments do not validate
    MARKUP_IN_TEXT = "markup_in_text"  # no call, but the family's call markup in the content: a parse miss
    TEXT = "text"  # plain text, no call (the engine chose to answer; fine under auto)
    EMPTY = "empty"  # neither calls nor content


# Text that only a family's call format writes (node/sim/answers.py render_calls), by tool parser.
MARKUP_SIGNS: Final[Mapping[str, tuple[str, ...]]] = {
    "hermes": ("<tool_call>",),
    "llama3_json": ('{"name"',),
    "deepseek_v3": ("<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "tool▁sep"),
    "deepseek_v31": ("<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "tool▁sep"),
}
ALL_SIGNS: Final = tuple(sorted({sign for signs in MARKUP_SIGNS.values() for sign in signs}))


@dataclass(slots=True)
class ToolCall:
    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""


@dataclass(slots=True)
class Answer:
    """One streamed chat completion, put back together from its deltas."""

    content: str = ""
    reasoning: str = ""
    calls: dict[int, ToolCall] = field(default_factory=dict)
    finish_reason: str | None = None
    completion_tokens: int = 0
    prompt_tokens: int = 0
    done: bool = False  # the stream ended with [DONE]
    events: int = 0  # data events before [DONE]

    def feed(self, payload: bytes) -> bool:
        """Add one ``data:`` payload; True when it carried output (content, reasoning or a call fragment).

        Raises:
            ValueError: the payload is not JSON, or is an error object.
        """
        if payload == b"[DONE]":
            self.done = True
            return False
        self.events += 1
        chunk = msgspec.json.decode(payload)
        if not isinstance(chunk, dict) or "error" in chunk:
            raise ValueError(f"error event {payload[:300]!r}")
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.completion_tokens = int(usage.get("completion_tokens") or 0)
            self.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        output = False
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
            if delta.get("content"):
                self.content += delta["content"]
                output = True
            if delta.get("reasoning_content"):
                self.reasoning += delta["reasoning_content"]
                output = True
            for part in delta.get("tool_calls") or ():
                call = self.calls.setdefault(int(part.get("index", 0)), ToolCall(int(part.get("index", 0))))
                call.id = call.id or str(part.get("id") or "")
                function = part.get("function") or {}
                call.name += str(function.get("name") or "")
                call.arguments += str(function.get("arguments") or "")
                output = True
        return output

    def ordered_calls(self) -> list[ToolCall]:
        return [self.calls[index] for index in sorted(self.calls)]


def sse_payloads(buffer: bytearray) -> list[bytes]:
    """Cut the complete ``data:`` payloads off the front of ``buffer`` (a partial event stays in it)."""
    out: list[bytes] = []
    while True:
        end = buffer.find(b"\n\n")
        if end < 0:
            return out
        event = bytes(buffer[:end])
        del buffer[: end + 2]
        out += [line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:")]


# --- checking answers ---


def schema_errors(value: object, schema: Mapping[str, Any], path: str = "$") -> list[str]:
    """Why ``value`` does not match ``schema`` (the subset the bench's tools use: type, properties,
    required, additionalProperties, enum, string length, integer/number bounds); empty when it does."""
    kind = schema.get("type")
    if "enum" in schema and value not in schema["enum"]:
        return [f"{path}: {value!r} not in {schema['enum']}"]
    if kind == "object":
        if not isinstance(value, dict):
            return [f"{path}: not an object"]
        props: Mapping[str, Any] = schema.get("properties", {})
        errors = [f"{path}: missing {name!r}" for name in schema.get("required", ()) if name not in value]
        if schema.get("additionalProperties") is False:
            errors += [f"{path}: unexpected {name!r}" for name in value if name not in props]
        for name, item in value.items():
            if name in props:
                errors += schema_errors(item, props[name], f"{path}.{name}")
        return errors
    if kind == "string":
        if not isinstance(value, str):
            return [f"{path}: not a string"]
        low, high = schema.get("minLength", 0), schema.get("maxLength", math.inf)
        return [] if low <= len(value) <= high else [f"{path}: length {len(value)} outside [{low}, {high}]"]
    if kind in ("integer", "number"):
        if isinstance(value, bool) or not isinstance(value, int if kind == "integer" else (int, float)):
            return [f"{path}: not an {kind}"]
        low, high = schema.get("minimum", -math.inf), schema.get("maximum", math.inf)
        return [] if low <= value <= high else [f"{path}: {value} outside [{low}, {high}]"]
    if kind == "boolean":
        return [] if isinstance(value, bool) else [f"{path}: not a boolean"]
    return []


def call_errors(call: ToolCall, tools: Sequence[Mapping[str, Any]]) -> list[str]:
    """Why ``call`` is not a valid call of one of ``tools``; empty when it is."""
    schemas = {tool["function"]["name"]: tool["function"]["parameters"] for tool in tools}
    if call.name not in schemas:
        return [f"unknown function {call.name!r}"]
    try:
        arguments = json.loads(call.arguments)
    except ValueError:
        return [f"{call.name}: arguments are not JSON: {call.arguments[:200]!r}"]
    return [f"{call.name}: {error}" for error in schema_errors(arguments, schemas[call.name])]


def classify(answer: Answer, tools: Sequence[Mapping[str, Any]]) -> tuple[Outcome, list[str]]:
    """The answer's outcome and, for a bad call, why."""
    if answer.calls:
        errors = [error for call in answer.ordered_calls() for error in call_errors(call, tools)]
        return (Outcome.CALL_BAD, errors) if errors else (Outcome.CALL_OK, [])
    if any(sign in answer.content for sign in ALL_SIGNS):
        return Outcome.MARKUP_IN_TEXT, [answer.content[:300]]
    return (Outcome.TEXT, []) if answer.content.strip() else (Outcome.EMPTY, [])


# --- request bodies ---


def tool_result(call: ToolCall) -> str:
    """The client's result for one call: a small JSON object naming the call."""
    return json.dumps({"ok": True, "function": call.name, "result": f"done: {call.arguments[:60]}"})


def first_turn(number: int) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": f"Conversation {number}: what is the weather in Paris this week?"},
    ]


def second_turn(messages: list[dict[str, Any]], answer: Answer) -> list[dict[str, Any]]:
    """``messages`` with the answer's calls as the assistant turn and one tool result per call."""
    calls = answer.ordered_calls()
    assistant = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls
        ],
    }
    results = [{"role": "tool", "tool_call_id": c.id, "content": tool_result(c)} for c in calls]
    return [*messages, assistant, *results]


def chat_body(
    model: str,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]],
    *,
    seed: int,
    max_tokens: int,
    thinking: bool | None = None,
) -> bytes:
    """A streaming chat request offering ``tools`` under ``tool_choice: auto``; ``thinking`` False closes the
    think block in the prompt (``chat_template_kwargs.enable_thinking``)."""
    body: dict[str, Any] = {
        "model": model,
        "messages": list(messages),
        "tools": list(tools),
        "tool_choice": "auto",
        "max_tokens": max_tokens,
        "seed": seed,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if thinking is not None:
        body["chat_template_kwargs"] = {"enable_thinking": thinking}
    return msgspec.json.encode(body)
