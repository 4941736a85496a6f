"""Round robin over the healthy workers, in a stable order so every worker gets its turn."""

from __future__ import annotations

from collections.abc import Sequence

from node.routing.policy import C, RouteRequest, Stateless


class RoundRobin(Stateless):
    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def select(self, candidates: Sequence[C], request: RouteRequest) -> C:
        chosen = candidates[self._next % len(candidates)]
        self._next = (self._next + 1) % (1 << 62)
        return chosen
