"""The pipeline's child spans (routing decision, generate, template+tokenize, storage), made from the tracer in
the request's record: with tracing off that is a no-op tracer and every span here costs next to nothing."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar

from opentelemetry.trace import INVALID_SPAN, Span, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from node.telemetry.record import NO_TRACER, RequestRecord

_PROPAGATOR = TraceContextTextMapPropagator()


class _Routable(Protocol):
    @property
    def url(self) -> str: ...

    @property
    def in_flight(self) -> int: ...


class _Pool(Protocol):
    @property
    def policy_name(self) -> str: ...


W = TypeVar("W", bound=_Routable)


def _same(worker: W) -> W:
    return worker


# Reusable (nullcontext keeps no state): what the spans are when tracing is off.
_UNTRACED: contextlib.AbstractContextManager[Span] = contextlib.nullcontext(INVALID_SPAN)
_UNTRACED_ROUTING: contextlib.AbstractContextManager[Callable[[Any], Any]] = contextlib.nullcontext(_same)


def routing_span(
    rec: RequestRecord, pool: _Pool, attempt: int, *, role: str = "regular"
) -> contextlib.AbstractContextManager[Callable[[W], W]]:
    """A span around one worker selection; the function it yields notes the chosen worker (and passes it on).
    A selection that raises (no healthy worker) ends the span with the error recorded."""
    if rec.tracer is NO_TRACER:  # tracing off: the no-op tracer's own context manager costs ~15 us
        return _UNTRACED_ROUTING
    return _routing_span(rec, pool, attempt, role)


@contextlib.contextmanager
def _routing_span(rec: RequestRecord, pool: _Pool, attempt: int, role: str) -> Iterator[Callable[[W], W]]:
    attributes: dict[str, str | int] = {
        "smg.routing.policy": pool.policy_name,
        "smg.routing.role": role,
        "smg.attempt": attempt,
    }
    with rec.tracer.start_as_current_span("route", attributes=attributes) as span:

        def chosen(worker: W) -> W:
            if span.is_recording():
                span.set_attribute("smg.worker", worker.url)
                span.set_attribute("smg.worker.in_flight", worker.in_flight)
                why = f"{pool.policy_name} chose it" + (" (a retry: earlier workers excluded)" if attempt > 1 else "")
                span.set_attribute("smg.routing.reason", why)
            return worker

        yield chosen


class _Spec(Protocol):
    @property
    def request_id(self) -> str: ...

    @property
    def prompt_ids(self) -> object: ...


def generate_span(rec: RequestRecord, worker: str, spec: _Spec) -> Span:
    """The span of one generate call on ``worker`` (a child of the current span; end it with end_generate_span)."""
    return rec.tracer.start_span(
        "generate", attributes={"smg.worker": worker, "smg.worker_request_id": spec.request_id}
    )


class _Usage(Protocol):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


def end_generate_span(span: Span, rec: RequestRecord, usage: _Usage) -> None:
    if span.is_recording():
        if (ttft := rec.ttft_s) is not None:
            span.set_attribute("gen_ai.server.time_to_first_token", ttft)
        span.set_attribute("gen_ai.usage.input_tokens", usage.prompt_tokens)
        span.set_attribute("gen_ai.usage.output_tokens", usage.completion_tokens)
        span.set_attribute("smg.usage.cached_tokens", usage.cached_tokens)
    span.end()


def span_headers(span: Span) -> tuple[tuple[str, str], ...]:
    """W3C traceparent (and tracestate) naming ``span``, for a worker call's metadata; () when not traced."""
    if not span.get_span_context().is_valid:
        return ()
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=set_span_in_context(span))
    return tuple(carrier.items())


def stage_span(rec: RequestRecord, name: str, **attributes: str | int) -> contextlib.AbstractContextManager[Span]:
    """A span around one stage of the request (template+tokenize, storage)."""
    if rec.tracer is NO_TRACER:
        return _UNTRACED
    return rec.tracer.start_as_current_span(name, attributes=attributes)
