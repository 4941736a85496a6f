"""round_robin and random: the baseline spreads."""

from __future__ import annotations

import random

from node.routing.policy import LoadView, RouteRequest, load_of
from node.routing.random_choice import RandomChoice
from node.routing.round_robin import RoundRobin
from tests.routing.helpers import FakeWorker, report, spread, workers

REQUEST = RouteRequest(prompt_ids=[1, 2, 3])


def test_round_robin_gives_every_worker_its_turn() -> None:
    pool = workers(3)
    policy = RoundRobin()
    chosen = [policy.select(pool, REQUEST).url for _ in range(6)]
    assert chosen == [w.url for w in pool] * 2


def test_random_is_reproducible_from_its_seed_and_roughly_uniform() -> None:
    pool = workers(4)
    first = spread(RandomChoice(random.Random(7)), pool, [REQUEST] * 4000)
    again = spread(RandomChoice(random.Random(7)), pool, [REQUEST] * 4000)
    assert first == again
    assert all(850 < first[w.url] < 1150 for w in pool)


def test_a_candidate_without_a_load_attribute_reads_as_unreported() -> None:
    class Bare:
        url = "grpc://bare:1"
        in_flight = 0

    assert load_of(Bare()) is None
    view = report(3, 4)
    assert load_of(FakeWorker("grpc://x:1", load=view)) is view
    assert isinstance(view, LoadView)
