"""The gateway's error tree. Raised anywhere in node/, mapped once to each API's envelope at the HTTP edge."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

_NO_HEADERS: Final[Mapping[str, str]] = MappingProxyType({})


class GatewayError(Exception):
    """Base: a request failed with a status the client should see. ``param`` names the offending field;
    ``headers`` go on the error response (WWW-Authenticate, Retry-After)."""

    status = 500
    error_type = "server_error"
    code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] = _NO_HEADERS,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.headers = headers
        if code is not None:
            self.code = code


class InvalidRequest(GatewayError):
    status = 400
    error_type = "invalid_request_error"


class ContextLengthExceeded(InvalidRequest):
    code = "context_length_exceeded"


class ModelNotFound(GatewayError):
    status = 404
    error_type = "invalid_request_error"
    code = "model_not_found"


class Unauthorized(GatewayError):
    """Missing or bad credentials (OpenAI answers 401 invalid_api_key)."""

    status = 401
    error_type = "invalid_request_error"
    code = "invalid_api_key"


class Forbidden(GatewayError):
    """A valid identity without the right to this route."""

    status = 403
    error_type = "invalid_request_error"
    code = "insufficient_permissions"


class RateLimited(GatewayError):
    """A limit of the caller's identity is exhausted (headers carry Retry-After and x-ratelimit-*)."""

    status = 429
    error_type = "requests"
    code = "rate_limit_exceeded"


class NotFound(GatewayError):
    status = 404
    error_type = "invalid_request_error"
    code = "not_found"


class PayloadTooLarge(GatewayError):
    status = 413
    error_type = "invalid_request_error"
    code = "request_too_large"


class UnsupportedEncoding(GatewayError):
    status = 415
    error_type = "invalid_request_error"
    code = "unsupported_content_encoding"


class NoHealthyWorker(GatewayError):
    status = 503
    error_type = "service_unavailable"
    code = "no_healthy_worker"


class WorkerFailed(GatewayError):
    """The worker broke mid-request (connection lost, RPC error, engine-reported error)."""

    status = 502
    error_type = "server_error"
    code = "worker_error"


class WorkerProtocolError(WorkerFailed):
    """The worker broke the Generate contract (a token id outside the vocabulary, a choice index >= n, more
    cached than prompt tokens): a fault of that worker, counted against its circuit breaker."""

    code = "worker_protocol_error"


class WorkerIncomplete(WorkerFailed):
    """The worker ended its Generate stream before every choice had finished."""


class WorkerAborted(WorkerFailed):
    """The worker ended a choice with finish reason "abort" that the gateway had not asked for."""


class WorkerTimeout(WorkerFailed):
    """A worker stream tripped a deadline (``kind``: "request", "first_token" or "idle").

    ``received``: the worker had sent something before, so the request cannot move to another worker.
    ``client_bound``: the deadline was the client's own (its SDK's timeout header): the client has given up,
    which says nothing about the worker (no mark against its breaker, no retry).
    """

    status = 504
    code = "worker_timeout"

    def __init__(self, message: str, *, kind: str, received: bool, client_bound: bool = False) -> None:
        super().__init__(message)
        self.kind = kind
        self.received = received
        self.client_bound = client_bound

    @property
    def retryable(self) -> bool:
        """Worth sending to another worker: nothing came back yet and the client still waits."""
        return not self.received and not self.client_bound


class KvEventsUnsupported(WorkerFailed):
    """The worker does not implement SubscribeKvEvents (routing falls back to its own guesses)."""
