"""The request context: made once at the HTTP edge (node/http/middleware.py) and handed down every stage.

It carries what is about the request rather than its body: who asks, under which id, by when. Stages read
it; none re-derives it from headers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from node.auth.identity import Identity


@dataclass(slots=True)
class RequestContext:
    # The client's X-Request-Id (when it sent a valid one) or one we minted; echoed in the response header
    # and in logs. Not the worker request id: clients may repeat theirs, workers need unique ones.
    request_id: str
    # The tenant: the verified identity's when authentication is on, else as node/http/tenancy.py decides.
    tenant: str = "default"
    # Who asks (node/auth): None when the node runs without authentication.
    identity: Identity | None = None
    # Affinity key for routing policies (the routing-key header), if the client sent one.
    routing_key: str | None = None
    # The request's headers (case-insensitive lookups), for the hints stages honour without parsing the
    # body: the client SDKs' timeout headers tighten Dispatch's deadlines (node/workers/deadlines.py).
    headers: Mapping[str, str] = field(default_factory=dict)
    # The request's server span (node/telemetry/observe.py; INVALID_SPAN when not traced): stages may annotate
    # it, nothing requires it. Child spans come from node/telemetry/spans.py.
    span: object | None = field(default=None)
