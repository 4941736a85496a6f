from __future__ import annotations

import random
from collections import Counter

from node.routing.policy import RouteRequest
from node.routing.power_of_two import PowerOfTwo
from tests.routing.helpers import FakeWorker, report, route, workers


def policy(seed: int = 1) -> PowerOfTwo:
    return PowerOfTwo(random.Random(seed), load_stale_after_s=30.0)


def test_the_less_loaded_worker_is_chosen_more_often() -> None:
    pool = workers(3)
    for w, in_flight in zip(pool, (10, 5, 0), strict=True):
        w.in_flight = in_flight
    # No credit is recorded without on_routed: a pure comparison of the fixed loads.
    p = policy()
    counts = [0, 0, 0]
    for _ in range(600):
        counts[pool.index(p.select(pool, RouteRequest([1])))] += 1
    assert counts[2] > counts[1] > counts[0] == 0  # the busiest worker never wins a pair


def test_a_burst_between_two_polls_water_fills_instead_of_herding() -> None:
    pool = workers(4)
    pool[0].load = report(0, 0, at=0.0)  # looked idle at the last poll
    for w in pool[1:]:
        w.load = report(10, 0, at=0.0)
    p = policy()
    counts: Counter[str] = Counter()
    for _ in range(200):
        chosen = route(p, pool, RouteRequest([1] * 100, now_s=1.0))
        chosen.in_flight += 1  # as in the pool: a burst between two polls is still open at the next pick
        counts[chosen.url] += 1
    # Loads end near (30 + 200) / 4 each: the idle-looking worker takes ~57, not the ~100 it would take if
    # every pair containing it went its way.
    assert 45 <= counts[pool[0].url] <= 70
    final = [counts[w.url] + (0 if w is pool[0] else 10) for w in pool]
    assert max(final) - min(final) <= 15


def test_a_fresh_report_replaces_the_credit_it_already_counts() -> None:
    pool = workers(2)
    p = policy()
    for w in pool:
        w.load = report(0, 0, at=0.0)
    for _ in range(5):
        p.on_routed(pool[0], RouteRequest([1], now_s=1.0))
    # Sampled after those dispatches: the report includes them, credit is dropped.
    pool[0].load = report(1, 0, at=2.0)
    pool[1].load = report(2, 0, at=2.0)
    assert p.select(pool, RouteRequest([1], now_s=3.0)) is pool[0]


def test_when_either_of_the_pair_has_no_report_both_compare_in_flight() -> None:
    reported = FakeWorker("grpc://a:1", in_flight=10, load=report(0, 0, at=0.0))
    silent = FakeWorker("grpc://b:1", in_flight=2)
    assert policy().select([reported, silent], RouteRequest([1])) is silent


def test_a_stale_report_is_ignored() -> None:
    stale = FakeWorker("grpc://a:1", in_flight=9, load=report(0, 0, at=0.0))
    fresh = FakeWorker("grpc://b:1", in_flight=1, load=report(5, 5, at=99.0))
    # At t=100 a's report is 100 s old (> 30 s): both fall back to in-flight.
    assert policy().select([stale, fresh], RouteRequest([1], now_s=100.0)) is fresh


def test_one_candidate_is_chosen_without_a_draw() -> None:
    (only,) = workers(1)
    assert route(policy(), [only], RouteRequest([1])) is only
