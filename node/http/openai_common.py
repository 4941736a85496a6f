"""Validation and formatting shared by the OpenAI chat and completions endpoints."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

from node.config import RequestLimits
from node.errors import ContextLengthExceeded, InvalidRequest, ModelNotFound
from node.http.openai_types import SamplingFields
from node.pipeline.cpu import CpuPool
from node.pipeline.generate import TokenLogprob, Usage
from node.pipeline.served_model import ServedModel
from node.routing.config import DEFAULT_ROUTING_KEY_HEADER
from node.workers.pool import WorkerPool
from node.workers.types import SamplingParams

_SEED_MASK = (1 << 31) - 1  # the engine contract carries an int32 seed


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now_s() -> int:
    return int(time.time())


def check_model(requested: str, model: ServedModel) -> None:
    if not model.answers_to(requested):
        raise ModelNotFound(f"The model '{requested}' does not exist or you do not have access to it.", param="model")


def _range(name: str, value: float | None, lo: float, hi: float, *, lo_open: bool = False) -> None:
    if value is None:
        return
    if value < lo or value > hi or (lo_open and value == lo):
        bound = f"({lo}, {hi}]" if lo_open else f"[{lo}, {hi}]"
        raise InvalidRequest(f"'{name}' must be in {bound}, got {value}.", param=name)


def stop_strings(req: SamplingFields) -> tuple[str, ...]:
    stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])  # count/size: node.http.limits
    if any(s == "" for s in stops):
        raise InvalidRequest("'stop' strings must not be empty.", param="stop")
    return tuple(dict.fromkeys(stops))


def validate_sampling(req: SamplingFields, model: ServedModel) -> None:
    """Range checks OpenAI (and vLLM, for its extensions) apply. Raises InvalidRequest naming the field."""
    _range("temperature", req.temperature, 0.0, 2.0)
    _range("top_p", req.top_p, 0.0, 1.0, lo_open=True)
    _range("min_p", req.min_p, 0.0, 1.0)
    _range("frequency_penalty", req.frequency_penalty, -2.0, 2.0)
    _range("presence_penalty", req.presence_penalty, -2.0, 2.0)
    _range("repetition_penalty", req.repetition_penalty, 0.0, 2.0**31, lo_open=True)
    if req.top_k is not None and req.top_k < -1:
        raise InvalidRequest(f"'top_k' must be -1 (disabled) or >= 0, got {req.top_k}.", param="top_k")
    if req.n < 1:  # the upper bound is RequestLimits.max_n, checked at decode
        raise InvalidRequest(f"'n' must be >= 1, got {req.n}.", param="n")
    if req.min_tokens < 0:
        raise InvalidRequest(f"'min_tokens' must be >= 0, got {req.min_tokens}.", param="min_tokens")
    vocab = model.tokenizer.vocab_size
    for tid in req.stop_token_ids or ():
        if not 0 <= tid < vocab:
            raise InvalidRequest(f"'stop_token_ids' holds {tid}, outside the vocabulary.", param="stop_token_ids")
    if req.stream_options is not None and not req.stream:
        raise InvalidRequest("'stream_options' is only allowed when 'stream' is true.", param="stream_options")


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
    req: SamplingFields, model: ServedModel, *, max_tokens: int, logprobs: int | None
) -> SamplingParams:
    """The engine's sampling parameters: the request's values, else the model's generation_config defaults."""
    d = model.sampling_defaults
    temperature = req.temperature if req.temperature is not None else d.get("temperature")
    top_p = req.top_p if req.top_p is not None else d.get("top_p", 1.0)
    top_k = req.top_k if req.top_k is not None else int(d.get("top_k", 0))
    min_p = req.min_p if req.min_p is not None else d.get("min_p", 0.0)
    rep = req.repetition_penalty if req.repetition_penalty is not None else d.get("repetition_penalty", 1.0)
    return SamplingParams(
        max_tokens=max_tokens,
        min_tokens=min(req.min_tokens, max_tokens),
        temperature=temperature,
        top_p=top_p,
        top_k=max(top_k, 0),
        min_p=min_p,
        frequency_penalty=req.frequency_penalty or 0.0,
        presence_penalty=req.presence_penalty or 0.0,
        repetition_penalty=rep,
        seed=None if req.seed is None else req.seed & _SEED_MASK,
        n=req.n,
        stop_token_ids=tuple(req.stop_token_ids or ()),
        ignore_eos=req.ignore_eos,
        logprobs=logprobs,
        skip_special_tokens=req.skip_special_tokens,
    )


def terminators(req: SamplingFields, model: ServedModel) -> frozenset[int]:
    eos = frozenset() if req.ignore_eos else model.eos_token_ids
    return eos | frozenset(req.stop_token_ids or ())


def usage_dict(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
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


def _ignore_usage(usage: Usage) -> None:
    return None


@dataclass(frozen=True, slots=True)
class ApiContext:
    """What every generating endpoint (chat, completions, responses) needs; built once by the app."""

    model: ServedModel
    pool: WorkerPool
    cpu: CpuPool
    max_body_bytes: int
    limits: RequestLimits = field(default_factory=RequestLimits)
    on_usage: Callable[[Usage], None] = _ignore_usage
    routing_key_header: str = DEFAULT_ROUTING_KEY_HEADER


class GenerationApi:
    """Base of the generating endpoints: unpacks the shared context once.

    One instance serves one model; with several models, ``serving`` builds one per model and each routes a
    parsed request to the instance of the model it names (``_peer_for``).
    """

    def __init__(self, ctx: ApiContext) -> None:
        self._peers: list[Self] = []  # empty: just this one
        self._model = ctx.model
        self._pool = ctx.pool
        self._cpu = ctx.cpu
        self._max_body = ctx.max_body_bytes
        self._limits = ctx.limits
        self._on_usage = ctx.on_usage
        self._routing_key_header = ctx.routing_key_header
        self._token_text = TokenText(ctx.model)

    @classmethod
    def serving(cls, contexts: Sequence[ApiContext], **kw: Any) -> Self:
        """Instances for every model in ``contexts`` (one each), linked; returns the first."""
        peers = [cls(ctx, **kw) for ctx in contexts]
        for peer in peers:
            peer._peers = peers
        return peers[0]

    def _peer_for(self, requested: str) -> Self:
        """The instance serving model ``requested``; raises ModelNotFound (404)."""
        for peer in self._peers or [self]:
            if peer._model.answers_to(requested):
                return peer
        raise ModelNotFound(f"The model '{requested}' does not exist or you do not have access to it.", param="model")
