"""Anthropic Messages requests → the pipeline's neutral request (pure: no I/O).

Mapping onto the open model:
- ``system`` and the turns become chat-template messages: ``tool_use`` blocks the assistant's tool calls,
  ``tool_result`` blocks tool messages (``is_error``: the content is prefixed ``Error: ``), ``thinking``
  blocks passed back the turn's ``reasoning_content`` (``redacted_thinking`` is dropped: it is opaque).
  A final assistant turn is a prefill: the answer continues it.
- ``tools`` render through the template as OpenAI function tools do; ``tool_choice`` ``auto``/``any``/
  ``tool``/``none`` are the pipeline's auto/required/named/none (``any`` and ``tool`` are held to a call by the
  engine constraint when Prepare has one: ``node.pipeline.prepare.tool_constraint``).
- ``thinking`` sets the template's ``enable_thinking`` (enabled: true; disabled or omitted: false, as
  Anthropic does not think unless asked; adaptive: the template's default). ``budget_tokens`` bounds the
  reasoning tokens: a model still thinking when it reaches the budget has its block closed by the gateway and
  answers on (the continue step, node/pipeline/continuation.py); see README.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from node.errors import InvalidRequest
from node.http.anthropic_types import (
    MIN_THINKING_BUDGET_TOKENS,
    Block,
    CountTokensRequest,
    Message,
    MessagesRequest,
)
from node.pipeline.constraints import ToolForcing, tool_constraint
from node.pipeline.request import ChatPrompt, GenerateRequest, NamedTool, Sampling, ToolChoice, ToolUse
from node.structured.constraint import Constraint, ToolSpec


def _text_of(block: Block, where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise InvalidRequest(f"{where}.text: Field required (a string).", param=f"{where}.text")
    return text


def _refuse_block(kind: object, where: str) -> InvalidRequest:
    if kind in ("image", "document"):
        return InvalidRequest(
            f"{where}: this model does not take {kind} input; send text blocks only.", param=f"{where}.type"
        )
    return InvalidRequest(f"{where}.type: unsupported content block type {kind!r}.", param=f"{where}.type")


def _system_text(system: str | list[Block] | None) -> str | None:
    if system is None or isinstance(system, str):
        return system
    parts = []
    for k, block in enumerate(system):
        if block.get("type") != "text":
            raise _refuse_block(block.get("type"), f"system.{k}")
        parts.append(_text_of(block, f"system.{k}"))
    return "\n".join(parts)


def _result_text(block: Block, where: str) -> str:
    content = block.get("content", "")
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        parts = []
        for k, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text":
                raise _refuse_block(part.get("type") if isinstance(part, dict) else part, f"{where}.content.{k}")
            parts.append(_text_of(part, f"{where}.content.{k}"))
        text = "\n".join(parts)
    else:
        raise InvalidRequest(f"{where}.content: a string or a list of text blocks.", param=f"{where}.content")
    return f"Error: {text}" if block.get("is_error") is True else text


def _user(blocks: list[Block], i: int, out: list[dict[str, Any]]) -> None:
    texts: list[str] = []
    for k, block in enumerate(blocks):
        where = f"messages.{i}.content.{k}"
        kind = block.get("type")
        if kind == "text":
            texts.append(_text_of(block, where))
        elif kind == "tool_result":
            call_id = block.get("tool_use_id")
            if not isinstance(call_id, str):
                raise InvalidRequest(f"{where}.tool_use_id: Field required.", param=f"{where}.tool_use_id")
            if texts:
                out.append({"role": "user", "content": "\n".join(texts)})
                texts = []
            out.append({"role": "tool", "tool_call_id": call_id, "content": _result_text(block, where)})
        else:
            raise _refuse_block(kind, where)
    if texts:
        out.append({"role": "user", "content": "\n".join(texts)})


def _assistant(blocks: list[Block], i: int) -> dict[str, Any]:
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[dict[str, Any]] = []
    for k, block in enumerate(blocks):
        where = f"messages.{i}.content.{k}"
        kind = block.get("type")
        if kind == "text":
            texts.append(_text_of(block, where))
        elif kind == "thinking":
            thought = block.get("thinking")
            if not isinstance(thought, str):
                raise InvalidRequest(f"{where}.thinking: Field required.", param=f"{where}.thinking")
            thoughts.append(thought)
        elif kind == "redacted_thinking":
            continue  # opaque (another server's encrypted reasoning): nothing a template could render
        elif kind == "tool_use":
            name, call_id, args = block.get("name"), block.get("id"), block.get("input", {})
            if not isinstance(name, str) or not isinstance(call_id, str) or not isinstance(args, dict):
                raise InvalidRequest(f"{where}: a tool_use block needs id, name and an input object.", param=where)
            calls.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": args}})
        else:
            raise _refuse_block(kind, where)
    item: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if thoughts:
        item["reasoning_content"] = "".join(thoughts)
    if calls:
        item["tool_calls"] = calls
    return item


def template_messages(system: str | list[Block] | None, messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Messages in the shape Hugging Face chat templates read. Raises InvalidRequest naming the block."""
    if not messages:
        raise InvalidRequest("messages: at least one message is required.", param="messages")
    out: list[dict[str, Any]] = []
    text = _system_text(system)
    if text:
        out.append({"role": "system", "content": text})
    for i, msg in enumerate(messages):
        if isinstance(msg.content, str):
            out.append({"role": msg.role, "content": msg.content})
        elif msg.role == "user":
            _user(msg.content, i, out)
        else:
            out.append(_assistant(msg.content, i))
    return out


def _tools(req: CountTokensRequest) -> tuple[ToolUse | None, list[dict[str, Any]] | None]:
    """The neutral tool use and the tools as the template renders them (OpenAI's function shape)."""
    schemas: dict[str, dict[str, Any]] = {}
    rendered: list[dict[str, Any]] = []
    for k, tool in enumerate(req.tools or ()):
        if tool.type not in (None, "custom"):
            raise InvalidRequest(
                f"tools.{k}.type: server tool {tool.type!r} is not available; only custom tools are.",
                param=f"tools.{k}.type",
            )
        if tool.name in schemas:
            raise InvalidRequest(f"tools.{k}.name: two tools are named {tool.name!r}.", param=f"tools.{k}.name")
        schema = tool.input_schema or {"type": "object", "properties": {}}
        schemas[tool.name] = schema
        function: dict[str, Any] = {"name": tool.name, "parameters": schema}
        if tool.description is not None:
            function["description"] = tool.description
        rendered.append({"type": "function", "function": function})
    tc = req.tool_choice
    choice: ToolChoice = "auto"
    parallel = True
    if tc is not None:
        parallel = not tc.disable_parallel_tool_use
        if tc.type == "any":
            choice = "required"
        elif tc.type == "none":
            choice = "none"
        elif tc.type == "tool":
            if tc.name is None or tc.name not in schemas:
                raise InvalidRequest(
                    f"tool_choice.name: {tc.name!r} is not one of the tools given.", param="tool_choice.name"
                )
            choice = NamedTool(tc.name)
        if tc.type in ("any", "tool") and not schemas:
            raise InvalidRequest(f"tool_choice: {tc.type!r} needs at least one tool.", param="tool_choice")
    if not schemas:
        return None, None
    return ToolUse(schemas, choice, parallel), (rendered if choice != "none" else None)


def _thinking(req: CountTokensRequest, max_tokens: int | None) -> tuple[dict[str, Any] | None, int | None]:
    """The template switch and the reasoning budget (None: uncapped)."""
    t = req.thinking
    if t is None or t.type == "disabled":
        return {"enable_thinking": False}, None
    if t.type == "adaptive":
        return None, None
    if t.budget_tokens is None:
        raise InvalidRequest("thinking.budget_tokens: Field required.", param="thinking.budget_tokens")
    if t.budget_tokens < MIN_THINKING_BUDGET_TOKENS:
        raise InvalidRequest(
            f"thinking.budget_tokens: Input should be greater than or equal to {MIN_THINKING_BUDGET_TOKENS}.",
            param="thinking.budget_tokens",
        )
    if max_tokens is not None and t.budget_tokens >= max_tokens:
        raise InvalidRequest("`max_tokens` must be greater than `thinking.budget_tokens`.", param="max_tokens")
    return {"enable_thinking": True}, t.budget_tokens


def chat_prompt(req: CountTokensRequest, max_tokens: int | None) -> tuple[ChatPrompt, ToolUse | None, int | None]:
    """The prompt, the tool use and the reasoning budget of a request (``max_tokens`` None: count_tokens,
    which has none). Raises InvalidRequest naming the field."""
    tools, rendered = _tools(req)
    kwargs, budget = _thinking(req, max_tokens)
    messages = template_messages(req.system, req.messages)
    prefill = messages[-1]["role"] == "assistant" and not messages[-1].get("tool_calls")
    prompt = ChatPrompt(
        messages=messages,
        tools=rendered,
        add_generation_prompt=not prefill,
        continue_final_message=prefill,
        template_kwargs=kwargs,
        no_template_hint="start the node with --chat-template.",
    )
    return prompt, tools, budget


def messages_request(req: MessagesRequest) -> GenerateRequest:
    """The neutral request of a Messages call. Raises InvalidRequest naming the field."""
    if req.max_tokens < 1:
        raise InvalidRequest("max_tokens: Input should be greater than or equal to 1.", param="max_tokens")
    if req.temperature is not None and not 0.0 <= req.temperature <= 1.0:
        raise InvalidRequest("temperature: Input should be between 0 and 1.", param="temperature")
    prompt, tools, budget = chat_prompt(req, req.max_tokens)
    return GenerateRequest(
        model=req.model,
        prompts=(prompt,),
        sampling=Sampling(
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            stop=tuple(req.stop_sequences or ()),
            max_tokens=req.max_tokens,
        ),
        stream=req.stream,
        budget_param="max_tokens",
        prompt_param="messages",
        tools=tools,
        constraint=_forcing(tools),
        reasoning_budget=budget,
    )


def _forcing(tools: ToolUse | None) -> Constraint | None:
    """``tool_choice`` ``any`` / ``tool``: the engine is constrained to answer with the call(s), exactly as chat's
    ``required`` / named function are (node.pipeline.constraints), so the model cannot answer without calling."""
    if tools is None or tools.choice in ("auto", "none"):
        return None
    forcing = ToolForcing(tools.choice.name if isinstance(tools.choice, NamedTool) else None)
    return tool_constraint(forcing, [ToolSpec(name, schema) for name, schema in tools.schemas.items()])
