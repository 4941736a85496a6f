"""Typed values exchanged with workers. Protobuf stays behind the client; these enter the pipeline."""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from node.structured.constraint import Constraint
from node.workers.deadlines import Deadlines


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """What the engine needs to sample. Stop *strings* are absent on purpose: the engine never touches text,
    the gateway matches them on detokenized output and aborts the request."""

    max_tokens: int
    min_tokens: int = 0
    temperature: float | None = None
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    n: int = 1
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # top-k alternatives per token; None = no logprobs at all
    skip_special_tokens: bool = True
    # Structured output the engine enforces while sampling (smg-grpc-proto's `constraint` oneof); None: free.
    constraint: Constraint | None = None


@dataclass(frozen=True, slots=True)
class WorkerRequest:
    request_id: str
    prompt_ids: Sequence[int]
    params: SamplingParams
    stream: bool = True
    kv_transfer_params_json: str | None = None
    # The stream's deadlines (node.workers.deadlines.deadlines_for), applied where the worker's breaker sees
    # them (BreakerClient): a tripped one is a WorkerTimeout the breaker counts. None: unbounded.
    deadlines: Deadlines | None = None
    # Sent as call metadata: W3C traceparent/tracestate of the span this call belongs to (empty: not traced).
    trace_headers: tuple[tuple[str, str], ...] = ()
    # Takes the stream's messages as they arrive, in the connection's receive callback, instead of the reader
    # (``Push``); None, or a client that cannot push: every message goes to the reader.
    push: Push | None = None


class Pushed(enum.IntEnum):
    """What a ``Push`` did with the messages it was handed."""

    DECLINED = 0  # nothing: they go to the stream's reader as usual
    TAKEN = 1  # consumed: the reader never sees them and is not woken
    TAKEN_WAKE = 2  # consumed, and the reader must look at its state now: it is handed an empty batch


#: The push path of a Generate stream (node/pipeline/dispatch.py builds it): called with the messages that
#: arrived together, in order, synchronously in the worker connection's receive callback, without a task
#: wake-up or a generator step per message. Invariants: it declines (changing nothing) whatever needs more
#: than synchronous work (a finish, a contract fault, a client that is behind), so such messages reach the
#: reader as if there were no push, and it never raises. Order holds: messages it declined and the reader
#: has not taken yet are handed to it again, ahead of the next ones.
Push = Callable[[Sequence["WorkerOutput"]], Pushed]


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """Logprobs of generated tokens, aligned with the output's token_ids."""

    token_ids: Sequence[int]
    logprobs: Sequence[float]
    top_ids: Sequence[Sequence[int]] = ()
    top_logprobs: Sequence[Sequence[float]] = ()


class WorkerOutput(NamedTuple):
    """One message of a Generate stream, for one of the n choices (``index``).

    ``token_ids`` are the new ids of this chunk (streaming) or all ids (the final message of a non-streaming
    call). Counts are cumulative, as the engine reports them. ``finish_reason`` is set on the last message.

    A NamedTuple, not a frozen dataclass: one is built per message (per token when streaming), and a frozen
    dataclass's ``__init__`` pays an ``object.__setattr__`` call per field. Immutable all the same.
    """

    index: int  # type: ignore[assignment]  # the choice number; shadows tuple.index, which nothing here calls
    token_ids: Sequence[int]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    finish_reason: str | None = None
    matched_token_id: int | None = None
    logprobs: TokenLogprobs | None = None
    kv_transfer_params_json: str | None = None


@dataclass(frozen=True, slots=True)
class ModelInfo:
    served_model_name: str
    model_path: str
    max_context_length: int
    vocab_size: int
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    model_type: str = ""
    architectures: tuple[str, ...] = field(default=())
