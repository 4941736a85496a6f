"""Anthropic Messages request bodies as msgspec structs: one decoding pass gives typed values or an error
naming the field. Content blocks stay raw mappings here (their many types are told apart by ``type`` in
node/http/anthropic_messages.py, which names the offending block in its errors). Unknown fields are ignored,
as Anthropic's API ignores fields of features it does not know (``cache_control`` among them: caching is
the engine's, automatic)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from node.http.openai_types import Count, TopK

#: Anthropic's bound on ``metadata.user_id`` (an opaque id; this node reads it nowhere and stores it nowhere).
MAX_USER_ID_CHARS = 256
#: Anthropic's floor for an extended-thinking budget.
MIN_THINKING_BUDGET_TOKENS = 1024

Block = dict[str, Any]


class Message(msgspec.Struct, kw_only=True):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class ToolDef(msgspec.Struct, kw_only=True):
    name: str
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    # Anthropic's server tools (web_search, bash, ...) carry a versioned type; custom tools carry none.
    type: str | None = None


class ToolChoice(msgspec.Struct, kw_only=True):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False


class Thinking(msgspec.Struct, kw_only=True):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: Count | None = None


class Metadata(msgspec.Struct, kw_only=True):
    user_id: Annotated[str, msgspec.Meta(max_length=MAX_USER_ID_CHARS)] | None = None


class CountTokensRequest(msgspec.Struct, kw_only=True):
    """``/v1/messages/count_tokens``: what shapes the prompt."""

    model: str
    messages: list[Message]
    system: str | list[Block] | None = None
    tools: list[ToolDef] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None


class MessagesRequest(CountTokensRequest, kw_only=True):
    max_tokens: Count
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: TopK | None = None
    metadata: Metadata | None = None
    stream: bool = False
