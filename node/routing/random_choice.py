"""Uniformly random choice among the healthy workers, from an injected (seedable) generator."""

from __future__ import annotations

import random
from collections.abc import Sequence

from node.routing.policy import C, RouteRequest, Stateless


class RandomChoice(Stateless):
    name = "random"

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def select(self, candidates: Sequence[C], request: RouteRequest) -> C:
        return candidates[self._rng.randrange(len(candidates))]
