from __future__ import annotations

from node.routing.least_load import LeastLoad
from node.routing.policy import RouteRequest
from tests.routing.helpers import FakeWorker, report, route, workers

NOW = RouteRequest([1] * 100, now_s=1.0)


def policy() -> LeastLoad:
    return LeastLoad(
        kv_pressure_weight_s=0.15,
        default_throughput_tps=2000.0,
        mean_prefill_tokens=1024,
        mean_decode_tokens=256,
        load_stale_after_s=30.0,
    )


def test_the_worker_that_drains_its_queue_first_wins() -> None:
    slow = FakeWorker("grpc://slow:1", load=report(4, 2, uncached=4000, tps=1000.0))
    fast = FakeWorker("grpc://fast:1", load=report(4, 2, uncached=4000, tps=4000.0))
    assert policy().select([slow, fast], NOW) is fast


def test_queued_tokens_matter_more_than_queued_requests() -> None:
    few_long = FakeWorker("grpc://a:1", load=report(0, 1, uncached=30_000, tps=2000.0))
    many_short = FakeWorker("grpc://b:1", load=report(0, 6, uncached=600, tps=2000.0))
    assert policy().select([few_long, many_short], NOW) is many_short


def test_a_nearly_full_kv_cache_is_avoided() -> None:
    full = FakeWorker("grpc://a:1", load=report(0, 0, uncached=0, usage=0.98, tps=2000.0))
    queued = FakeWorker("grpc://b:1", load=report(0, 1, uncached=2000, usage=0.2, tps=2000.0))
    scores = policy().scores([full, queued], 1.0)
    assert scores[0] > 7.0 > scores[1]  # 0.15 * 0.98 / 0.02 = 7.35 s against ~1 s of queue
    assert policy().select([full, queued], NOW) is queued


def test_unknown_queued_tokens_are_estimated_from_waiting_requests() -> None:
    unknown = FakeWorker("grpc://a:1", load=report(0, 3, uncached=None, tps=2000.0))
    scores = policy().scores([unknown], 1.0)
    assert scores == [3 * 1024 / 2000.0]


def test_a_burst_spreads_by_the_tokens_sent_since_the_last_report() -> None:
    pool = workers(3)
    for w in pool:
        w.load = report(0, 0, uncached=0, at=0.0, tps=2000.0)
    least = policy()
    for _ in range(30):
        route(least, pool, NOW).in_flight += 1  # the burst's requests are all still open
    assert [w.in_flight for w in pool] == [10, 10, 10]


def test_of_what_was_sent_since_the_report_only_what_is_still_open_counts() -> None:
    # The report is old and idle; 10 prompts of 1000 tokens went to a since, but 9 of them have finished.
    a = FakeWorker("grpc://a:1", in_flight=1, load=report(0, 0, uncached=0, at=0.0, tps=2000.0))
    b = FakeWorker("grpc://b:1", load=report(0, 1, uncached=3000, at=0.0, tps=2000.0))  # 1.5 s of queue
    least = policy()
    for k in range(10):
        least.on_routed(a, RouteRequest([1] * 1000, now_s=1.0 + k))
    assert least.scores([a, b], 20.0) == [1000 / 2000.0, 3000 / 2000.0]  # not 10 000 tokens: 5 s
    assert least.select([a, b], RouteRequest([1] * 10, now_s=20.0)) is a


def test_running_requests_still_to_generate_count_in_the_drain_time() -> None:
    decoding = FakeWorker("grpc://a:1", load=report(20, 0, uncached=0, tps=2000.0))  # 20 * 128 tokens left
    queued = FakeWorker("grpc://b:1", load=report(0, 1, uncached=1000, tps=2000.0))
    assert policy().scores([decoding, queued], 1.0) == [20 * 128 / 2000.0, 1000 / 2000.0]
    assert policy().select([decoding, queued], NOW) is queued


def test_unreported_workers_are_scored_by_in_flight_at_the_pool_rate() -> None:
    reporting = FakeWorker("grpc://a:1", load=report(0, 2, uncached=8000, tps=4000.0))  # 2 s of queue
    silent_busy = FakeWorker("grpc://b:1", in_flight=10)  # 10 * (1024 + 128) / 4000 = 2.88 s
    silent_idle = FakeWorker("grpc://c:1", in_flight=1)
    assert policy().select([reporting, silent_busy], NOW) is reporting
    assert policy().select([reporting, silent_idle], NOW) is silent_idle


def test_with_no_reports_at_all_the_fewest_in_flight_wins() -> None:
    pool = workers(3)
    for w, n in zip(pool, (3, 1, 2), strict=True):
        w.in_flight = n
    assert policy().select(pool, NOW) is pool[1]
