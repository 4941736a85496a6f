"""The Prepare stage: a neutral request becomes generate specs. Model lookup, sampling checks, chat template
render, tokenize (on the CPU pool, through the tokenizer caches), token budget, engine params.

Every failure is an InvalidRequest (400), ContextLengthExceeded (400) or ModelNotFound (404) naming the
client's field; nothing is sent to a worker before all prompts of a request passed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from node.config import RequestLimits
from node.errors import ContextLengthExceeded, InvalidRequest, ModelNotFound
from node.pipeline.context import RequestContext
from node.pipeline.cpu import CpuPool
from node.pipeline.parsers.think import prompt_opens_reasoning
from node.pipeline.parsing import PROMPT_TAIL_IDS, ParserPlan
from node.pipeline.request import ChatPrompt, GenerateRequest, NamedTool, Prompt, Sampling, TextPrompt
from node.pipeline.served_model import ServedModel
from node.pipeline.spec import GenerateSpec, Prepared, PreparedPrompt
from node.pipeline.template import TemplateError
from node.structured.constraint import Constraint
from node.workers.types import SamplingParams

_SEED_MASK = (1 << 31) - 1  # the engine contract carries an int32 seed


def _range(name: str, value: float | None, lo: float, hi: float, *, lo_open: bool = False) -> None:
    if value is None:
        return
    if value < lo or value > hi or (lo_open and value == lo):
        bound = f"({lo}, {hi}]" if lo_open else f"[{lo}, {hi}]"
        raise InvalidRequest(f"'{name}' must be in {bound}, got {value}.", param=name)


def check_sampling(s: Sampling, model: ServedModel) -> None:
    """Range checks OpenAI (and vLLM, for its extensions) apply, stop strings, stop token ids in the
    vocabulary (counts and sizes are the request limits', checked at decode: node/http/limits.py). Raises
    InvalidRequest naming the field."""
    _range("temperature", s.temperature, 0.0, 2.0)
    _range("top_p", s.top_p, 0.0, 1.0, lo_open=True)
    _range("min_p", s.min_p, 0.0, 1.0)
    _range("frequency_penalty", s.frequency_penalty, -2.0, 2.0)
    _range("presence_penalty", s.presence_penalty, -2.0, 2.0)
    _range("repetition_penalty", s.repetition_penalty, 0.0, 2.0**31, lo_open=True)
    if s.top_k is not None and s.top_k < -1:
        raise InvalidRequest(f"'top_k' must be -1 (disabled) or >= 0, got {s.top_k}.", param="top_k")
    if s.n < 1:  # the upper bound is RequestLimits.max_n, checked at decode
        raise InvalidRequest(f"'n' must be >= 1, got {s.n}.", param="n")
    if s.min_tokens < 0:
        raise InvalidRequest(f"'min_tokens' must be >= 0, got {s.min_tokens}.", param="min_tokens")
    vocab = model.tokenizer.vocab_size
    for tid in s.stop_token_ids:
        if not 0 <= tid < vocab:
            raise InvalidRequest(f"'stop_token_ids' holds {tid}, outside the vocabulary.", param="stop_token_ids")
    if any(stop == "" for stop in s.stop):
        raise InvalidRequest("'stop' strings must not be empty.", param="stop")


def resolve_max_tokens(
    requested: int | None, prompt_len: int, model: ServedModel, *, param: str, prompt_param: str, cap: int | None = None
) -> int:
    """The completion budget (omitted: what the context leaves, at most ``cap``); raises ContextLengthExceeded
    when prompt + budget cannot fit."""
    ctx = model.max_context_length
    if requested is not None and requested < 1:
        raise InvalidRequest(f"'{param}' must be >= 1, got {requested}.", param=param)
    budget = requested if requested is not None else min(ctx - prompt_len, cap if cap is not None else ctx)
    if prompt_len + max(budget, 1) > ctx:
        asked = prompt_len + (requested or 0)
        detail = f"{prompt_len} in the {prompt_param}" + (f", {requested} in the completion" if requested else "")
        raise ContextLengthExceeded(
            f"This model's maximum context length is {ctx} tokens. However, you requested {asked} tokens "
            f"({detail}). Please reduce the length of the {prompt_param} or completion.",
            param=prompt_param,
        )
    return budget


def sampling_params(
    s: Sampling, model: ServedModel, *, max_tokens: int, constraint: Constraint | None = None
) -> SamplingParams:
    """The engine's sampling parameters: the request's values, else the model's generation_config defaults."""
    d = model.sampling_defaults
    temperature = s.temperature if s.temperature is not None else d.get("temperature")
    top_p = s.top_p if s.top_p is not None else d.get("top_p", 1.0)
    top_k = s.top_k if s.top_k is not None else int(d.get("top_k", 0))
    min_p = s.min_p if s.min_p is not None else d.get("min_p", 0.0)
    rep = s.repetition_penalty if s.repetition_penalty is not None else d.get("repetition_penalty", 1.0)
    return SamplingParams(
        max_tokens=max_tokens,
        min_tokens=min(s.min_tokens, max_tokens),
        temperature=temperature,
        top_p=top_p,
        top_k=max(top_k, 0),
        min_p=min_p,
        frequency_penalty=s.frequency_penalty or 0.0,
        presence_penalty=s.presence_penalty or 0.0,
        repetition_penalty=rep,
        seed=None if s.seed is None else s.seed & _SEED_MASK,
        n=s.n,
        stop_token_ids=s.stop_token_ids,
        ignore_eos=s.ignore_eos,
        logprobs=s.logprobs,
        skip_special_tokens=s.skip_special_tokens,
        constraint=constraint,
    )


def terminators(s: Sampling, model: ServedModel) -> frozenset[int]:
    eos = frozenset() if s.ignore_eos else model.eos_token_ids
    return eos | frozenset(s.stop_token_ids)


def render(prompt: ChatPrompt, model: ServedModel, *, param: str) -> str:
    """The prompt text: the chat template over the messages. Raises InvalidRequest (no template, a template
    error, a final message that cannot be continued)."""
    template = model.template
    if template is None:
        raise InvalidRequest(f"This model has no chat template; {prompt.no_template_hint}")
    try:
        text = template.render(
            prompt.messages,
            tools=prompt.tools,
            add_generation_prompt=prompt.add_generation_prompt,
            extra=prompt.template_kwargs,
        )
    except TemplateError as exc:
        raise InvalidRequest(f"The chat template could not render the {param}: {exc}", param=param) from exc
    if prompt.continue_final_message:
        final = prompt.messages[-1].get("content") or ""
        cut = text.rfind(final) if final else -1
        if cut < 0:
            raise InvalidRequest("Could not find the final message in the rendered prompt.", param=param)
        text = text[: cut + len(final)]
    return text


def parser_plan(
    request: GenerateRequest, model: ServedModel, prompt: Prompt, ids: Sequence[int], *, constrained: bool = False
) -> ParserPlan | None:
    """The output parsers of a chat prompt's answer: the model's reasoning parser, and its tool-call parser
    when tools are offered (tool_choice not "none"). ``constrained``: the engine is made to call (the
    tool_choice constraint is sent), so the answer is bare JSON read by the forced-call parser. Raw text and
    token prompts (the Completions API) are answered as plain text."""
    if not isinstance(prompt, ChatPrompt):
        return None
    parsers = model.parsers
    tools = request.tools
    offered = tools is not None and tools.choice != "none"
    tool_parser = parsers.tool_parser if offered else None
    reasoning = parsers.reasoning_parser
    forced: Literal["required"] | NamedTool | None = None
    if constrained and tools is not None:
        choice = tools.choice
        forced = choice if isinstance(choice, NamedTool) else "required" if choice == "required" else None
    if tool_parser is None and reasoning is None and forced is None:  # (no reasoning parser: nothing to cap)
        return None
    in_reasoning = False
    if reasoning is not None:
        tail = model.tokenizer.decode(ids[-PROMPT_TAIL_IDS:], skip_special_tokens=False)
        in_reasoning = prompt_opens_reasoning(tail)
    schemas = None
    max_calls = None
    if tool_parser is not None and tools is not None:
        choice = tools.choice
        # A named tool: a call of any other function is not the one asked for; it stays content.
        schemas = {choice.name: tools.schemas[choice.name]} if isinstance(choice, NamedTool) else tools.schemas
        bounds = [b for b in (None if tools.parallel else 1, tools.max_calls) if b is not None]
        max_calls = min(bounds) if bounds else None
    return ParserPlan(
        tool_parser=tool_parser,
        reasoning_parser=reasoning,
        tools=schemas,
        in_reasoning=in_reasoning,
        max_calls=max_calls,
        keep_ids=parsers.keep_ids,
        think_ids=parsers.think_ids,
        forced=forced,
        think_budget=request.reasoning_budget,
        think_close_ids=parsers.think_close_ids,
    )


def _chars(messages: Sequence[Any]) -> int:
    return sum(len(c) for m in messages if isinstance(c := m.get("content"), str))


class Prepare:
    """The stage, over the served models and the CPU pool."""

    def __init__(self, models: Sequence[ServedModel], cpu: CpuPool, limits: RequestLimits) -> None:
        self._models = tuple(models)
        self._cpu = cpu
        self._limits = limits

    def model(self, requested: str) -> ServedModel:
        """The served model answering to ``requested``; raises ModelNotFound (404)."""
        for model in self._models:
            if model.answers_to(requested):
                return model
        raise ModelNotFound(f"The model '{requested}' does not exist or you do not have access to it.", param="model")

    async def _encode(self, prompt: Prompt, model: ServedModel, param: str) -> PreparedPrompt:
        if isinstance(prompt, ChatPrompt):
            size = _chars(prompt.messages)
            ids = await self._cpu.render_and_encode(size, lambda: render(prompt, model, param=param), model.tokenizer)
            return PreparedPrompt(ids=ids, text=None)
        if isinstance(prompt, TextPrompt):
            ids = await self._cpu.encode(model.tokenizer, prompt.text, add_special_tokens=True)
            return PreparedPrompt(ids=ids, text=prompt.text)
        vocab = model.tokenizer.vocab_size
        if not prompt.ids:
            raise InvalidRequest("A token prompt must not be empty.", param=prompt.param)
        for t in prompt.ids:
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab:
                raise InvalidRequest(
                    f"Token ids in '{prompt.param}' must be integers in [0, {vocab}).", param=prompt.param
                )
        return PreparedPrompt(ids=list(prompt.ids), text=None)

    async def __call__(
        self, request: GenerateRequest, model: ServedModel, ctx: RequestContext, *, request_id: str
    ) -> Prepared:
        """Specs for every prompt of ``request``; worker request ids are ``request_id`` (``-k`` per prompt
        of a batch). Raises InvalidRequest, ContextLengthExceeded."""
        s = request.sampling
        check_sampling(s, model)
        stops = tuple(dict.fromkeys(s.stop))
        ends = terminators(s, model)
        prompts = [await self._encode(p, model, request.prompt_param) for p in request.prompts]
        # A constraint beside tool_choice required / named is the tool forcing (node.pipeline.constraints
        # allows one source per request): the engine writes the bare JSON call(s).
        constrained = request.constraint is not None
        specs = []
        # An omitted budget is bounded by the request limits' total over every choice of the request.
        cap = self._limits.output_cap(s.n * len(prompts), logprobs=s.logprobs is not None)
        for k, prompt in enumerate(prompts):
            max_tokens = resolve_max_tokens(
                s.max_tokens,
                len(prompt.ids),
                model,
                param=request.budget_param,
                prompt_param=request.prompt_param,
                cap=cap,
            )
            specs.append(
                GenerateSpec(
                    model=model.name,
                    request_id=request_id if len(prompts) == 1 else f"{request_id}-{k}",
                    prompt_ids=prompt.ids,
                    params=sampling_params(s, model, max_tokens=max_tokens, constraint=request.constraint),
                    stops=stops,
                    include_stop_str=s.include_stop_str,
                    terminators=ends,
                    routing_key=ctx.routing_key,
                    want_token_ids=request.want_token_ids,
                    client_stream=request.stream,
                    vocab_size=model.tokenizer.vocab_size,
                    parsing=parser_plan(request, model, request.prompts[k], prompt.ids, constrained=constrained),
                )
            )
        return Prepared(model=model, request_id=request_id, prompts=tuple(prompts), specs=tuple(specs))
