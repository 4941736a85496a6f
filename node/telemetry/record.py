"""One request's observations, filled as the request moves through the node and read once when it ends.

The observe middleware (node/telemetry/observe.py) makes the record and binds it to the request's task
(``bind``); the pipeline notes what it learns (``current()``: model, worker, first token, usage) without
knowing who reads it. A task created for the request copies the binding, so it notes into the same record.
Outside a request (``current()`` with nothing bound) notes go to a throwaway record: callers never check.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field

from opentelemetry.trace import INVALID_SPAN, Span, Tracer
from opentelemetry.trace import NoOpTracer as _NoOpTracer

NO_TRACER: Tracer = _NoOpTracer()


@dataclass(slots=True)
class RequestRecord:
    """Times are ``time.perf_counter()`` seconds; ``None`` until the moment happened."""

    request_id: str = ""
    method: str = ""
    route: str = ""
    started: float = field(default_factory=time.perf_counter)
    tenant: str = ""
    model: str = ""  # the served model's name (never the raw request field: a bounded label)
    worker: str = ""  # the worker that generated (the decode worker under PD disaggregation)
    policy: str = ""  # the routing policy that chose it
    dispatched: float | None = None  # the request went to a worker
    first_token: float | None = None
    last_token: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    # (worker, failure class) of every attempt a worker failed; as many as the retry policy's attempts
    worker_errors: list[tuple[str, str]] = field(default_factory=list)
    tracer: Tracer = NO_TRACER
    span: Span = INVALID_SPAN  # the request's server span (INVALID_SPAN: not traced)

    def routed(self, worker: str, policy: str, model: str | None) -> None:
        self.worker = worker
        self.policy = policy
        self.model = model or self.model
        if self.dispatched is None:
            self.dispatched = time.perf_counter()

    def failed(self, worker: str, error: Exception) -> None:
        self.worker_errors.append((worker, type(error).__name__))

    def tokens(self, count: int) -> None:
        """``count`` new output tokens arrived now."""
        if count <= 0:
            return
        now = time.perf_counter()
        if self.first_token is None:
            self.first_token = now
        self.last_token = now

    def usage(self, prompt: int, completion: int, cached: int) -> None:
        self.prompt_tokens, self.completion_tokens, self.cached_tokens = prompt, completion, cached

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.started

    @property
    def queue_s(self) -> float | None:
        """From arrival to dispatch: template, tokenize, the CPU pool's queue and routing."""
        return None if self.dispatched is None else self.dispatched - self.started

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first (vLLM's time_per_output_token)."""
        if self.first_token is None or self.last_token is None or self.completion_tokens < 2:
            return None
        return (self.last_token - self.first_token) / (self.completion_tokens - 1)


_CURRENT: ContextVar[RequestRecord | None] = ContextVar("smg_request_record", default=None)


def current() -> RequestRecord:
    """The record of the request this task serves (a throwaway one outside any request)."""
    record = _CURRENT.get()
    return record if record is not None else RequestRecord()


@contextlib.contextmanager
def bind(record: RequestRecord) -> Iterator[RequestRecord]:
    token = _CURRENT.set(record)
    try:
        yield record
    finally:
        _CURRENT.reset(token)
