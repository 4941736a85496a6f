"""OpenAI request bodies as msgspec structs: one decoding pass gives typed values or an error naming a field.

Unknown fields are ignored, as OpenAI does. Value ranges are checked by the API modules after decoding.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

Role = Literal["system", "developer", "user", "assistant", "tool"]


class ContentPart(msgspec.Struct, kw_only=True):
    type: str
    text: str | None = None


class FunctionCall(msgspec.Struct, kw_only=True):
    name: str
    arguments: str = ""


class ToolCall(msgspec.Struct, kw_only=True):
    id: str = ""
    type: str = "function"
    function: FunctionCall


class ChatMessage(msgspec.Struct, kw_only=True):
    role: Role
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class FunctionDef(msgspec.Struct, kw_only=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(msgspec.Struct, kw_only=True):
    type: Literal["function"] = "function"
    function: FunctionDef


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool = False


class SamplingFields(msgspec.Struct, kw_only=True):
    """Fields shared by chat and completions (OpenAI's, plus vLLM's common extensions)."""

    model: str
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    n: int = 1
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None


class ChatCompletionRequest(SamplingFields, kw_only=True):
    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[Tool] | None = None
    tool_choice: Any = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None


class CompletionRequest(SamplingFields, kw_only=True):
    # str | list[str] | list[int] | list[list[int]]: msgspec unions allow one array type, checked after.
    prompt: str | list[Any]
    max_tokens: int | None = 16  # OpenAI's default for the legacy Completions API
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None
