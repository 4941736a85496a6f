from __future__ import annotations

from collections import Counter

from node.routing.policy import RouteRequest
from node.routing.prefix_hash import PrefixHash, prefix_key
from node.routing.ring import HashRing
from tests.routing.helpers import prompt, report, workers

SYSTEM = list(range(900_000, 900_300))  # a 300-token shared system prompt


def policy(urls: list[str], *, prefix_tokens: int = 256, abs_threshold: int = 10) -> PrefixHash:
    p = PrefixHash(
        prefix_tokens=prefix_tokens,
        load_factor=1.25,
        balance_abs_threshold=abs_threshold,
        virtual_nodes=150,
        load_stale_after_s=30.0,
    )
    p.on_workers_changed(urls)
    return p


def test_prompts_sharing_the_hashed_prefix_meet_on_one_worker() -> None:
    pool = workers(4)
    p = policy([w.url for w in pool])
    chosen = {p.select(pool, RouteRequest(prompt(i, 1000, prefix=SYSTEM))).url for i in range(50)}
    assert len(chosen) == 1


def test_different_prefixes_spread_over_the_workers() -> None:
    pool = workers(4)
    p = policy([w.url for w in pool], prefix_tokens=64)
    counts = Counter(p.select(pool, RouteRequest(prompt(i, 500))).url for i in range(800))
    assert all(120 < counts[w.url] < 280 for w in pool)


def test_an_overloaded_worker_is_passed_over_for_the_next_on_the_ring_consistently() -> None:
    pool = workers(4)
    p = policy([w.url for w in pool])
    home = p.select(pool, RouteRequest(prompt(0, 400, prefix=SYSTEM)))
    ring = HashRing(150, [w.url for w in pool])
    owners = list(ring.owners(prefix_key(SYSTEM, 256)))
    assert owners[0] == home.url
    home.in_flight = 40  # mean 10: 40 > 1.25 * 10 and 40 > 10 + 10
    escaped = {p.select(pool, RouteRequest(prompt(i, 400, prefix=SYSTEM))).url for i in range(20)}
    assert escaped == {owners[1]}


def test_low_load_noise_does_not_break_affinity() -> None:
    pool = workers(4)
    p = policy([w.url for w in pool])
    home = p.select(pool, RouteRequest(SYSTEM))
    home.in_flight = 3  # 4x the mean of 0.75, but only 2.25 above it
    assert p.select(pool, RouteRequest(SYSTEM)) is home


def test_an_overloaded_worker_takes_no_new_prefixes_until_it_recovers() -> None:
    pool = workers(3)
    p = policy([w.url for w in pool], abs_threshold=0)
    for w in pool:
        w.load = report(30, 0, at=0.0)
    prompts = [RouteRequest(prompt(i, 300), now_s=1.0) for i in range(60)]
    homes = {id(r): p.select(pool, r) for r in prompts}
    assert len(set(map(id, homes.values()))) == 3
    pool[0].load = report(90, 0, at=1.0)  # mean 50: 90 > 1.25 * 50
    assert all(p.select(pool, r) is not pool[0] for r in prompts)
    pool[0].load = report(30, 0, at=2.0)
    assert all(p.select(pool, r) is homes[id(r)] for r in prompts)
