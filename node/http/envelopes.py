"""Error envelopes: how each API shapes an error body. Every route is served by one adapter, and its
errors leave in that adapter's envelope (node/http/middleware.py looks it up per route); routes no adapter
owns (health, metrics, unknown paths) use OpenAI's, the node's primary API.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from node.errors import GatewayError
from node.http.errors import error_body


@dataclass(frozen=True, slots=True)
class EdgeError:
    """An error as the HTTP edge answers it, before an API gives it its shape."""

    status: int
    message: str
    error_type: str
    param: str | None = None
    code: str | None = None
    # The request's id (X-Request-Id, echoed or minted), so a client can quote it from the body alone.
    request_id: str | None = None

    @classmethod
    def of(cls, exc: GatewayError) -> EdgeError:
        return cls(exc.status, exc.message, exc.error_type, exc.param, exc.code)


class ErrorEnvelope(Protocol):
    def status(self, error: EdgeError) -> int:
        """The HTTP status the API answers this error with (APIs differ: Anthropic's overloaded is 529)."""
        ...

    def body(self, error: EdgeError) -> bytes:
        """The JSON body of an error response."""
        ...


class OpenAIEnvelope:
    """{"error": {"message", "type", "param", "code", "request_id"}} (request_id: our addition, which OpenAI's
    SDKs keep in the error's body)"""

    def status(self, error: EdgeError) -> int:
        return error.status

    def body(self, error: EdgeError) -> bytes:
        return error_body(
            error.message, error.error_type, param=error.param, code=error.code, request_id=error.request_id
        )


OPENAI = OpenAIEnvelope()
