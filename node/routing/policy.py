"""The routing seam: a policy picks one worker among the healthy candidates for a request.

The pool drives every policy through three calls, all synchronous and pure (no clock, no I/O inside):

- ``select(candidates, request)`` picks one of the healthy ``candidates`` (never empty). It is a query: it
  changes no learned state, so it may be asked again for a retry.
- ``on_routed(candidate, request)`` says the request was sent to ``candidate``. Call it with the *same*
  ``request`` object right after ``select`` and before the next ``await``, once per worker actually tried
  (a connect-failure retry to another worker is a second call). Policies that learn (cache trees, sticky
  maps, dispatch credit) learn here.
- ``on_workers_changed(urls)`` gives every configured worker URL, healthy or not, at start and whenever
  the configured set changes (not on health flaps: health is expressed by who is among the candidates).

Time enters only as ``RouteRequest.now_s`` (the pool's monotonic clock), the same clock as
``LoadView.updated_at``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar


@dataclass(frozen=True, slots=True)
class LoadView:
    """The engine's own account of its load, as the pool last heard it (GetLoads or a KvEventBatch's load).

    Summed over data-parallel ranks. ``updated_at`` is the pool clock (seconds) at which the engine sampled
    it: the receive time minus ``EngineLoad.age_ms`` when known.
    """

    running: int
    waiting: int
    waiting_uncached_tokens: int | None  # queued prompt tokens not served from cache; None: engine can't tell
    token_usage: float  # KV-cache utilisation in [0, 1]
    gen_throughput: float  # tokens/s; 0 when the engine reports none (idle, or unknown)
    updated_at: float


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """What a policy may look at: the prompt's token ids, the routing key, and the time of routing."""

    prompt_ids: Sequence[int]
    routing_key: str | None = None
    now_s: float = 0.0  # the pool's monotonic clock when the request is routed
    model: str | None = None  # the served model; the pool offers only its workers as candidates
    # URLs of workers this request already failed on: the pool offers them again only when no other is left.
    exclude: frozenset[str] = frozenset()


class Candidate(Protocol):
    """A worker as a policy sees it.

    Load-aware policies also read an optional ``load: LoadView | None`` attribute (see ``load_of``): a
    candidate without it is treated as one whose engine has not reported.
    """

    @property
    def url(self) -> str: ...

    @property
    def in_flight(self) -> int: ...  # requests this gateway has open on the worker


C = TypeVar("C", bound=Candidate)


class RoutingPolicy(Protocol):
    name: str

    def select(self, candidates: Sequence[C], request: RouteRequest) -> C:
        """Return one of ``candidates`` (never empty: the pool answers 503 before asking)."""
        ...

    def on_routed(self, candidate: Candidate, request: RouteRequest) -> None:
        """``request`` was sent to ``candidate``."""
        ...

    def on_workers_changed(self, urls: Sequence[str]) -> None:
        """The configured workers are now ``urls`` (healthy or not)."""
        ...


class Stateless:
    """Hooks for a policy that learns nothing from what it routed."""

    def on_routed(self, candidate: Candidate, request: RouteRequest) -> None:
        return None

    def on_workers_changed(self, urls: Sequence[str]) -> None:
        return None


def load_of(candidate: Candidate) -> LoadView | None:
    """The candidate's reported load, or None when it carries none."""
    view = getattr(candidate, "load", None)
    return view if isinstance(view, LoadView) else None
