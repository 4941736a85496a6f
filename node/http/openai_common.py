"""What the OpenAI adapters (chat, completions, responses) share: their fields → the neutral request, ids,
usage and logprob rendering, and their base class."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from node.errors import InvalidRequest
from node.http.adapter import AdapterEnv
from node.http.envelopes import OPENAI, ErrorEnvelope
from node.http.ids import random_hex
from node.http.openai_types import SamplingFields
from node.pipeline import constraints
from node.pipeline.constraints import OutputConstraint
from node.pipeline.events import TokenLogprob, Usage
from node.pipeline.request import NamedTool, Sampling, ToolChoice, ToolUse
from node.pipeline.served_model import ServedModel


def new_id(prefix: str) -> str:
    return f"{prefix}-{random_hex()}"


def now_s() -> int:
    return int(time.time())


def sampling_of(req: SamplingFields, *, max_tokens: int | None, logprobs: int | None) -> Sampling:
    """OpenAI's (and vLLM's) sampling fields as the neutral request has them. Raises InvalidRequest for a
    combination only OpenAI forbids (ranges are the Prepare stage's)."""
    if req.stream_options is not None and not req.stream:
        raise InvalidRequest("'stream_options' is only allowed when 'stream' is true.", param="stream_options")
    return Sampling(
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        min_p=req.min_p,
        frequency_penalty=req.frequency_penalty,
        presence_penalty=req.presence_penalty,
        repetition_penalty=req.repetition_penalty,
        seed=req.seed,
        n=req.n,
        stop=(req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ()),
        stop_token_ids=tuple(req.stop_token_ids or ()),
        ignore_eos=req.ignore_eos,
        min_tokens=req.min_tokens,
        skip_special_tokens=req.skip_special_tokens,
        include_stop_str=req.include_stop_str_in_output,
        logprobs=logprobs,
        max_tokens=max_tokens,
    )


def tool_use(
    schemas: Mapping[str, Mapping[str, Any]],
    raw_choice: Any,
    *,
    parallel: bool,
    api: Literal["chat", "responses"],
    max_calls: int | None = None,
) -> ToolUse | None:
    """The request's tools and ``tool_choice`` as the neutral request has them (None: no tools listed).
    A named choice is ``{"type": "function", "function": {"name"}}`` in Chat Completions and
    ``{"type": "function", "name"}`` in Responses. Raises InvalidRequest naming ``tool_choice``."""
    choice: ToolChoice
    if raw_choice is None:
        choice = "auto" if schemas else "none"
    elif raw_choice in ("none", "auto", "required"):
        choice = raw_choice
    elif isinstance(raw_choice, dict) and raw_choice.get("type") == "function":
        holder = raw_choice.get("function") if api == "chat" else raw_choice
        name = holder.get("name") if isinstance(holder, dict) else None
        if not isinstance(name, str):
            where = "tool_choice.function.name" if api == "chat" else "tool_choice.name"
            raise InvalidRequest(f"Missing required parameter: '{where}'.", param="tool_choice")
        if name not in schemas:
            raise InvalidRequest(
                f"'tool_choice' names the function {name!r}, which is not in 'tools'.", param="tool_choice"
            )
        choice = NamedTool(name)
    else:
        raise InvalidRequest(
            "'tool_choice' must be 'none', 'auto', 'required' or a function tool choice object.", param="tool_choice"
        )
    if choice == "required" and not schemas:
        raise InvalidRequest("'tool_choice' is 'required' but no 'tools' are given.", param="tool_choice")
    if max_calls is not None and max_calls < 0:
        raise InvalidRequest("'max_tool_calls' must be >= 0.", param="max_tool_calls")
    return ToolUse(schemas, choice, parallel, max_calls) if schemas else None


def output_constraint(
    req: SamplingFields,
    *,
    tools: Sequence[Any] | None = None,
    tool_choice: object = None,
    text_format: object = None,
) -> OutputConstraint | None:
    """The structured-output constraint the request sets (node.pipeline.constraints); raises InvalidRequest."""
    legacy = {name: getattr(req, name) for name in constraints.LEGACY_FIELDS}
    return constraints.resolve(
        response_format=req.response_format,
        text_format=text_format,
        structured_outputs=req.structured_outputs,
        legacy=legacy,
        tools=tools,
        tool_choice=tool_choice,
    )


def include_usage(req: SamplingFields) -> bool:
    return req.stream_options is not None and req.stream_options.include_usage


def usage_dict(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
    }


class TokenText:
    """Text of single tokens for logprobs output, memoized (bounded by the vocabulary)."""

    def __init__(self, model: ServedModel) -> None:
        self._tokenizer = model.tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = self._tokenizer.decode([token_id], skip_special_tokens=False)
            self._cache[token_id] = text
        return text

    def chat_entry(self, lp: TokenLogprob, top_n: int) -> dict[str, Any]:
        token = self(lp.token_id)
        return {
            "token": token,
            "logprob": lp.logprob,
            "bytes": list(token.encode("utf-8")),
            "top_logprobs": [
                {"token": (t := self(tid)), "logprob": v, "bytes": list(t.encode("utf-8"))} for tid, v in lp.top[:top_n]
            ],
        }


class OpenAIAdapter:
    """Base of the OpenAI adapters: the pipeline, the body bound, OpenAI's error envelope."""

    envelope: ErrorEnvelope = OPENAI

    def __init__(self, env: AdapterEnv) -> None:
        self._pipeline = env.pipeline
        self._max_body = env.max_body_bytes
        self._token_texts = {m.name: TokenText(m) for m in env.pipeline.models}
