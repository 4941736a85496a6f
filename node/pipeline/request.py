"""The neutral request: what every API adapter (OpenAI chat, completions, responses; Anthropic messages)
parses its own body into, and all the Prepare stage reads. No API's field names or envelope leak past it,
except the names errors quote (``budget_param``, ``prompt_param``): the client must recognise its field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from node.structured.constraint import Constraint


@dataclass(frozen=True, slots=True)
class Sampling:
    """Sampling knobs as the client sent them (None: the model's generation_config default, else the
    engine's). Ranges are checked by the Prepare stage (``node.pipeline.prepare.check_sampling``)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    n: int = 1
    # Stop strings, in the client's order (duplicates are dropped by Prepare).
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True
    include_stop_str: bool = False
    # Top-k alternatives per generated token; None: no logprobs at all.
    logprobs: int | None = None
    # The completion budget asked for; None: whatever the context window leaves.
    max_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class ChatPrompt:
    """Messages (and tools) in the shape Hugging Face chat templates read; rendered by Prepare."""

    messages: Sequence[Mapping[str, Any]]
    tools: Sequence[Mapping[str, Any]] | None = None
    add_generation_prompt: bool = True
    # Hugging Face semantics: the prompt ends right after the final message's content.
    continue_final_message: bool = False
    template_kwargs: Mapping[str, Any] | None = None
    # What the "no chat template" error tells the client to do instead (APIs differ in their fallback).
    no_template_hint: str = "start the node with --chat-template."


@dataclass(frozen=True, slots=True)
class TextPrompt:
    """Raw text, encoded with the tokenizer's special tokens (BOS) as the Completions API does."""

    text: str


@dataclass(frozen=True, slots=True)
class TokenPrompt:
    """Token ids as the client sent them (checked against the vocabulary by Prepare)."""

    ids: Sequence[int]
    param: str = "prompt"


Prompt = ChatPrompt | TextPrompt | TokenPrompt


@dataclass(frozen=True, slots=True)
class NamedTool:
    """``tool_choice`` naming one function the model must call."""

    name: str


#: "none": tools are not offered (not rendered, not parsed); "auto": the model may call; "required" and a
#: named tool: it must (GenerateRequest.constraint, node.pipeline.constraints, makes the engine call).
ToolChoice = Literal["none", "auto", "required"] | NamedTool


@dataclass(frozen=True, slots=True)
class ToolUse:
    """The request's function tools as the output parsers and the constraint need them."""

    # Function name -> its parameters JSON schema ({} when the tool declares none).
    schemas: Mapping[str, Mapping[str, Any]]
    choice: ToolChoice = "auto"
    # False: at most one call per choice is kept (OpenAI's parallel_tool_calls).
    parallel: bool = True
    # At most this many calls per choice are kept (the Responses API's max_tool_calls); None: no bound.
    max_calls: int | None = None


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    """One API request, neutral. Several ``prompts`` (the Completions API's batch) fan out into one
    generation each, their choices numbered ``prompt * n + choice``."""

    model: str
    prompts: tuple[Prompt, ...]
    sampling: Sampling
    stream: bool = False
    # Keep per-token ids on content deltas (the Completions API's echo/logprobs need them).
    want_token_ids: bool = False
    # The API's names of the budget and prompt fields, for error messages and ``param``.
    budget_param: str = "max_tokens"
    prompt_param: str = "messages"
    # The tools offered (None: none; tool calls are not parsed).
    tools: ToolUse | None = None
    # Structured output the engine must enforce (node.pipeline.constraints; each adapter reads its API's fields).
    # With tool_choice required or a named function it is the tool forcing (one source at most per request).
    constraint: Constraint | None = None
    # At most this many tokens inside the reasoning block: a choice still reasoning then has the block closed
    # by the gateway and answers on (node/pipeline/continuation.py), or ends "length" when no answer fits
    # (None: uncapped). Enforced where reasoning tokens are counted by id (the model's think ids).
    reasoning_budget: int | None = None
