"""Fake candidates and a routing loop shared by the routing tests."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from node.routing.policy import LoadView, RouteRequest, RoutingPolicy


@dataclass(eq=False)
class FakeWorker:
    url: str
    in_flight: int = 0
    load: LoadView | None = None


def workers(n: int) -> list[FakeWorker]:
    return [FakeWorker(f"grpc://w{i}:50051") for i in range(n)]


def report(
    running: int = 0,
    waiting: int = 0,
    *,
    at: float = 0.0,
    uncached: int | None = None,
    usage: float = 0.0,
    tps: float = 0.0,
) -> LoadView:
    return LoadView(
        running=running,
        waiting=waiting,
        waiting_uncached_tokens=uncached,
        token_usage=usage,
        gen_throughput=tps,
        updated_at=at,
    )


def route(policy: RoutingPolicy, candidates: Sequence[FakeWorker], request: RouteRequest) -> FakeWorker:
    """What the pool does: select, then tell the policy where the request went."""
    chosen = policy.select(candidates, request)
    policy.on_routed(chosen, request)
    return chosen


def spread(policy: RoutingPolicy, candidates: Sequence[FakeWorker], requests: Sequence[RouteRequest]) -> Counter[str]:
    return Counter(route(policy, candidates, r).url for r in requests)


def prompt(seed: int, length: int, *, prefix: Sequence[int] = ()) -> list[int]:
    """A prompt of ``length`` tokens starting with ``prefix``, the rest unique to ``seed``."""
    tail = length - len(prefix)
    return [*prefix, *range(seed * 100_003 + 1, seed * 100_003 + 1 + tail)]
