"""Traces: OpenTelemetry spans exported over OTLP/HTTP, sampled by ratio, off by default.

The node owns its TracerProvider (none is installed globally): the observe middleware starts each request's
server span from the tracer it is handed, and the pipeline starts child spans from the tracer in the
request's record. W3C ``traceparent`` is read from the client's headers (a sampled parent is followed: the
sampler is parent-based) and written into every worker call's gRPC metadata (``trace_headers``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from opentelemetry.context import Context
from opentelemetry.trace import Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from node.config import TelemetryConfig

if TYPE_CHECKING:  # the SDK is imported when tracing is on (~0.1 s of every start otherwise)
    from opentelemetry.sdk.trace.export import SpanExporter

log = logging.getLogger(__name__)

_PROPAGATOR = TraceContextTextMapPropagator()  # stateless: W3C traceparent/tracestate
#: Exporting is off the request path (a background thread batches); past this many queued spans new ones
#: are dropped rather than held: an unreachable collector costs no memory growth.
MAX_QUEUED_SPANS = 2048
#: One export call waits at most this long for the collector.
EXPORT_TIMEOUT_S = 10.0


class Tracing:
    """The node's tracer provider. ``exporter`` replaces the OTLP exporter (tests: an in-memory one)."""

    def __init__(self, config: TelemetryConfig, *, exporter: SpanExporter | None = None) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        self._provider = TracerProvider(
            resource=Resource.create({"service.name": config.trace_service_name}),
            sampler=ParentBased(TraceIdRatioBased(config.trace_sample_ratio)),
        )
        if exporter is not None:
            self._provider.add_span_processor(SimpleSpanProcessor(exporter))
        elif config.otlp_traces_endpoint:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            otlp = OTLPSpanExporter(endpoint=config.otlp_traces_endpoint, timeout=EXPORT_TIMEOUT_S)
            self._provider.add_span_processor(BatchSpanProcessor(otlp, max_queue_size=MAX_QUEUED_SPANS))
        else:
            log.warning("tracing is on but --otlp-traces-endpoint is not set: spans are made and not exported")
        self.tracer: Tracer = self._provider.get_tracer("smg-node")

    def close(self) -> None:
        """Flush what is queued (bounded by the exporter's timeout) and stop the export thread."""
        self._provider.shutdown()


def extract(headers: Mapping[str, str]) -> Context:
    """The trace context a client's ``traceparent`` header names (an empty context without one)."""
    return _PROPAGATOR.extract(carrier=headers)
