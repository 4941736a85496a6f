from __future__ import annotations

import random
from collections import Counter

from node.routing.manual import Manual
from node.routing.policy import RouteRequest
from tests.routing.helpers import route, workers


def policy(*, ttl_s: float = 100.0, max_entries: int = 1000) -> Manual:
    return Manual(random.Random(5), ttl_s=ttl_s, max_entries=max_entries, load_stale_after_s=30.0)


def ask(key: str | None, now: float = 0.0) -> RouteRequest:
    return RouteRequest([1, 2, 3], key, now_s=now)


def test_a_key_sticks_to_its_worker_even_when_others_are_idler_or_new() -> None:
    pool = workers(4)
    p = policy()
    home = route(p, pool[:3], ask("alice"))
    home.in_flight = 50
    assert all(route(p, pool, ask("alice", t)) is home for t in range(1, 20))


def test_new_keys_spread_over_the_least_loaded_workers() -> None:
    pool = workers(3)
    p = policy()
    counts = Counter(route(p, pool, ask(f"user-{i}")).url for i in range(300))
    assert all(counts[w.url] > 60 for w in pool)
    pool[1].in_flight = 5
    assert all(route(p, pool, ask(f"late-{i}")) is not pool[1] for i in range(30))


def test_a_key_moves_only_when_its_worker_is_out_of_rotation_and_stays_moved() -> None:
    pool = workers(3)
    p = policy()
    home = route(p, pool, ask("alice", 0))
    others = [w for w in pool if w is not home]
    moved = route(p, others, ask("alice", 1))
    assert moved is not home
    # The original worker is back: the key stays where it now lives.
    assert route(p, pool, ask("alice", 2)) is moved
    # Its new worker fails: back to the previous one, which may still hold the session's cache.
    assert route(p, [w for w in pool if w is not moved], ask("alice", 3)) is home
    assert p.assigned("alice") == (home.url, moved.url)


def test_an_idle_key_is_forgotten_after_its_ttl() -> None:
    pool = workers(2)
    p = policy(ttl_s=10.0)
    route(p, pool, ask("alice", 0.0))
    route(p, pool, ask("bob", 5.0))
    route(p, pool, ask("carol", 12.0))  # alice idle 12 s > 10 s
    assert p.assigned("alice") == ()
    assert p.assigned("bob") != ()
    assert len(p) == 2


def test_the_least_recently_used_key_goes_first_beyond_the_bound() -> None:
    pool = workers(2)
    p = policy(max_entries=2)
    route(p, pool, ask("a", 0))
    route(p, pool, ask("b", 1))
    route(p, pool, ask("a", 2))
    route(p, pool, ask("c", 3))
    assert (p.assigned("a") != (), p.assigned("b"), p.assigned("c") != ()) == (True, (), True)


def test_requests_without_a_key_are_spread_at_random_and_remembered_nowhere() -> None:
    pool = workers(3)
    p = policy()
    counts = Counter(route(p, pool, ask(None)).url for _ in range(300))
    assert len(counts) == 3
    assert len(p) == 0


def test_a_worker_removed_from_the_configuration_is_forgotten() -> None:
    pool = workers(2)
    p = policy()
    home = route(p, pool, ask("alice"))
    p.on_workers_changed([w.url for w in pool if w is not home])
    assert p.assigned("alice") == ()
