"""OpenAI request bodies as msgspec structs: one decoding pass gives typed values or an error naming a field.

Unknown fields are ignored, as OpenAI does. Value ranges are checked by the API modules after decoding, and
configurable bounds by `node.http.limits`; the ranges below are what the engine's wire format can carry.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

Role = Literal["system", "developer", "user", "assistant", "tool"]

# Integers that reach the engine's protobuf int32/uint32 fields: out of range is a 400 naming the field at
# decode, not an encoding error at dispatch. (`seed` is masked to int32 instead, as OpenAI seeds are int64.)
_INT32_MAX = 2**31 - 1
Count = Annotated[int, msgspec.Meta(ge=-_INT32_MAX, le=_INT32_MAX)]  # sign checked by the endpoint, with a message
TopK = Annotated[int, msgspec.Meta(ge=-1, le=_INT32_MAX)]  # -1 (or 0) disables top-k
TokenId = Annotated[int, msgspec.Meta(ge=0, le=_INT32_MAX)]


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
    # An earlier assistant turn's reasoning, as this API returned it (vLLM's field); templates that render
    # reasoning (Qwen3's, for the turn after the last user message) read it.
    reasoning_content: str | None = None


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
    top_k: TopK | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    n: Count = 1
    stop: str | list[str] | None = None
    stop_token_ids: list[TokenId] | None = None
    ignore_eos: bool = False
    min_tokens: Count = 0
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # Structured output (node.pipeline.constraints checks them): OpenAI's response_format, vLLM's
    # structured_outputs and its pre-0.12 guided_* spellings.
    response_format: Any = None
    structured_outputs: Any = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None


class ChatCompletionRequest(SamplingFields, kw_only=True):
    messages: list[ChatMessage]
    max_tokens: Count | None = None
    max_completion_tokens: Count | None = None
    logprobs: bool = False
    top_logprobs: Count | None = None
    tools: list[Tool] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool = True
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    # vLLM's: at most this many reasoning tokens, then the block is closed and the model answers.
    thinking_token_budget: Count | None = None


class CompletionRequest(SamplingFields, kw_only=True):
    # str | list[str] | list[int] | list[list[int]]: msgspec unions allow one array type, checked after.
    prompt: str | list[Any]
    max_tokens: Count | None = 16  # OpenAI's default for the legacy Completions API
    logprobs: Count | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: Count | None = None
