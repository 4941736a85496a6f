"""The request context: made once at the HTTP edge (node/http/middleware.py) and handed down every stage.

It carries what is about the request rather than its body: who asks, under which id, by when. Stages read
it; none re-derives it from headers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from node.auth.identity import Identity
from node.config import TENANT_HEADER
from node.errors import InvalidRequest
from storage.errors import InvalidInput
from storage.validation import check_tenant

DEFAULT_TENANT = "default"


@dataclass(slots=True)
class RequestContext:
    # The client's X-Request-Id (when it sent a valid one) or one we minted; echoed in the response header
    # and in logs. Not the worker request id: clients may repeat theirs, workers need unique ones.
    request_id: str
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
    # The tenant the request claims (node/http/tenancy.py decides whether the header may claim one), checked
    # only when a route reads ``tenant``: a bad claim fails the routes that use a tenant, never /health.
    tenant_claim: str | None = None
    _tenant: str | None = None

    @property
    def tenant(self) -> str:
        """The verified identity's tenant when authentication is on (whatever the headers say); else the
        checked claim, or ``default``. Raises InvalidRequest (400, ``param`` the tenant header) for a claim
        no store accepts."""
        if self._tenant is None:
            identity = self.identity
            self._tenant = identity.tenant if identity is not None else checked_tenant(self.tenant_claim)
        return self._tenant


def checked_tenant(claim: str | None) -> str:
    """``claim`` if a store accepts it as a tenant, ``default`` for none. Raises InvalidRequest."""
    if claim is None:
        return DEFAULT_TENANT
    try:
        check_tenant(claim)
    except InvalidInput as exc:
        raise InvalidRequest(f"Invalid {TENANT_HEADER} header: {exc}", param=TENANT_HEADER) from exc
    return claim
