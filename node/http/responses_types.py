"""Request bodies of the Responses and Conversations APIs as msgspec structs.

Items stay plain JSON objects here: they are validated field by field (with the offending field named) by
`node.pipeline.responses_items`, and stored verbatim afterwards. Unknown fields are ignored, as OpenAI does.
"""

from __future__ import annotations

from typing import Any

import msgspec

from node.http.openai_types import Count, SamplingFields


class ConversationRef(msgspec.Struct, kw_only=True):
    id: str


class ResponsesRequest(SamplingFields, kw_only=True):
    """POST /v1/responses. The vLLM sampling extensions of SamplingFields (top_k, ignore_eos, ...) apply."""

    input: str | list[Any] | None = None
    instructions: str | None = None
    previous_response_id: str | None = None
    conversation: str | ConversationRef | None = None
    store: bool = True
    max_output_tokens: Count | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool = True
    max_tool_calls: Count | None = None
    text: Any = None  # {"format": {"type": "text" | "json_object" | "json_schema", ...}}
    metadata: dict[str, str] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    # Echoed on the response as sent (OpenAI's fields a self-hosted model has no use for, or not yet).
    top_logprobs: Count | None = None
    reasoning: dict[str, Any] | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    truncation: str | None = None

    @property
    def conversation_id(self) -> str | None:
        conv = self.conversation
        return conv.id if isinstance(conv, ConversationRef) else conv


class ConversationCreateRequest(msgspec.Struct, kw_only=True):
    items: list[Any] | None = None
    metadata: dict[str, str] | None = None


class ConversationUpdateRequest(msgspec.Struct, kw_only=True):
    metadata: dict[str, str]


class ItemsCreateRequest(msgspec.Struct, kw_only=True):
    items: list[Any]
