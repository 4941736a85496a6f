from __future__ import annotations

from node.routing.bucket import Bucket, auto_boundaries, bucket_group
from node.routing.policy import RouteRequest
from tests.routing.helpers import report, workers


def policy(boundaries: tuple[int, ...] = (), abs_threshold: int = 64) -> Bucket:
    return Bucket(
        boundaries_tokens=boundaries,
        balance_abs_threshold=abs_threshold,
        balance_rel_threshold=1.5,
        load_stale_after_s=30.0,
    )


def length(n: int) -> RouteRequest:
    return RouteRequest([7] * n)


def test_short_and_long_prompts_go_to_different_workers() -> None:
    pool = workers(2)
    p = policy((1024,))
    assert {p.select(pool, length(n)).url for n in (1, 500, 1023)} == {pool[0].url}
    assert {p.select(pool, length(n)).url for n in (1024, 5000, 100_000)} == {pool[1].url}


def test_workers_are_assigned_in_url_order_whatever_the_candidate_order() -> None:
    pool = workers(2)
    assert policy((1024,)).select(list(reversed(pool)), length(10)) is pool[0]


def test_each_bucket_takes_the_least_loaded_worker_of_its_group() -> None:
    pool = workers(4)  # buckets (<1024, >=1024) over groups (w0, w1) and (w2, w3)
    pool[2].in_flight = 3
    assert policy((1024,)).select(pool, length(2000)) is pool[3]
    assert policy((1024,)).select(pool, length(10)) is pool[0]


def test_with_more_buckets_than_workers_neighbouring_buckets_share_one() -> None:
    assert [bucket_group(b, 4, 2) for b in range(4)] == [range(0, 1), range(0, 1), range(1, 2), range(1, 2)]
    assert [bucket_group(b, 2, 5) for b in range(2)] == [range(0, 2), range(2, 5)]


def test_without_boundaries_one_bucket_per_worker_up_to_4096_tokens() -> None:
    pool = workers(4)
    assert auto_boundaries(4) == (1024, 2048, 3072)
    p = policy()
    assert [p.select(pool, length(n)) for n in (10, 1500, 2500, 50_000)] == pool


def test_an_imbalanced_pool_sends_to_the_least_loaded_whatever_the_length() -> None:
    pool = workers(2)
    pool[0].load = report(80, 0, at=0.0)
    pool[1].load = report(2, 0, at=0.0)
    assert policy((1024,)).select(pool, length(10)) is pool[1]
