"""What an API adapter is: a module that parses one API's requests into the pipeline's neutral request and
renders the pipeline's typed events into that API's JSON, SSE and error envelope.

Adding an API is one new module with an ``Adapter`` class and one line in ``node/http/adapters.py``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web

from node.http.envelopes import ErrorEnvelope
from node.http.history import History
from node.http.tenancy import ApiConfig
from node.pipeline.pipeline import Pipeline

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True, slots=True)
class Route:
    method: str
    path: str
    handler: Handler


@dataclass(frozen=True, slots=True)
class AdapterEnv:
    """Everything an adapter may be built from (made once by build_app)."""

    pipeline: Pipeline
    max_body_bytes: int
    history: History
    tenancy: ApiConfig


class Adapter(Protocol):
    @property
    def envelope(self) -> ErrorEnvelope:
        """The error envelope of every route this adapter serves."""
        ...

    def routes(self) -> Sequence[Route]: ...


AdapterFactory = Callable[[AdapterEnv], Adapter]
