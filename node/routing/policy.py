"""The routing seam: a policy picks one worker among the healthy candidates for a request."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """What a policy may look at. Later policies use the prompt ids (prefix/cache affinity) and the key."""

    prompt_ids: Sequence[int]
    routing_key: str | None = None


class Candidate(Protocol):
    @property
    def url(self) -> str: ...

    @property
    def in_flight(self) -> int: ...


C = TypeVar("C", bound=Candidate)


class RoutingPolicy(Protocol):
    name: str

    def select(self, candidates: Sequence[C], request: RouteRequest) -> C:
        """Return one of ``candidates`` (never empty: the pool answers 503 before asking)."""
        ...
