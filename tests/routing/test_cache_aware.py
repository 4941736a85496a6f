from __future__ import annotations

from collections import Counter

from node.routing.cache_aware import CacheAware
from node.routing.kv_events import BlocksStored, CacheCleared, KvEventBatch, StoredBlock
from node.routing.kv_index import KvIndex
from node.routing.policy import RouteRequest
from tests.routing.helpers import FakeWorker, prompt, report, route, workers

SYSTEM = list(range(700_000, 700_512))  # 32 pages every conversation shares


def policy(*, kv_index: KvIndex | None = None, threshold: float = 0.3, max_pages: int = 100_000) -> CacheAware:
    return CacheAware(
        cache_threshold=threshold,
        balance_abs_threshold=8,
        balance_rel_threshold=1.5,
        page_size_tokens=16,
        tree_max_pages=max_pages,
        load_stale_after_s=30.0,
        kv_index=kv_index,
    )


def test_a_conversation_keeps_returning_to_the_worker_that_holds_it() -> None:
    pool = workers(4)
    p = policy()
    conversation = prompt(1, 1400)
    turns = [conversation[: 400 + 200 * t] for t in range(6)]  # each turn extends the previous
    homes = {route(p, pool, RouteRequest(ids)).url for ids in turns}
    assert len(homes) == 1


def test_new_conversations_spread_to_the_workers_holding_least() -> None:
    pool = workers(4)
    p = policy()
    counts = Counter(route(p, pool, RouteRequest(prompt(i, 320))).url for i in range(40))
    assert sorted(counts.values()) == [10, 10, 10, 10]


def test_a_match_below_the_threshold_does_not_attract() -> None:
    pool = workers(2)
    p = policy(threshold=0.5)
    first = route(p, pool, RouteRequest(prompt(1, 3000, prefix=SYSTEM)))  # first gets 32 + more pages
    # A long new prompt sharing only the system prompt: 512 / 3000 < 0.5, so the emptier worker takes it.
    assert p.select(pool, RouteRequest(prompt(2, 3000, prefix=SYSTEM))) is not first
    # A short one sharing it: 512 / 600 >= 0.5, it goes where the system prompt is cached.
    assert p.select(pool, RouteRequest(prompt(3, 600, prefix=SYSTEM))) is first


def test_an_imbalanced_pool_sends_to_the_least_loaded_despite_the_cache() -> None:
    pool = workers(3)
    p = policy()
    conversation = prompt(1, 2000)
    home = route(p, pool, RouteRequest(conversation))
    home.in_flight = 30  # 30 - 0 > 8 and 30 > 1.5 * 0
    busy, idlest = (w for w in pool if w is not home)
    busy.in_flight = 2
    assert p.select(pool, RouteRequest(conversation)) is idlest


def test_exact_kv_events_outrank_the_guess_for_a_worker_that_publishes_them() -> None:
    guessed, publishing = FakeWorker("grpc://a:1"), FakeWorker("grpc://b:1")
    index = KvIndex(10_000)
    p = policy(kv_index=index)
    conversation = prompt(1, 800)
    route(p, [guessed], RouteRequest(conversation))  # the tree says a holds 50 pages of it
    blocks = tuple(StoredBlock(i + 1, tuple(conversation[i * 16 : (i + 1) * 16])) for i in range(50))
    index.apply(publishing.url, KvEventBatch(1, (BlocksStored(blocks, None, 16),)))
    # Both hold the whole conversation; b's holding is known, and b's tree stays empty as it publishes.
    cached, matched = p.cache_view([guessed, publishing], RouteRequest(conversation))
    assert matched == [800, 800] and cached == [800, 800]
    route(p, [publishing], RouteRequest(prompt(2, 800)))
    assert p.tree.pages_of(publishing.url) == 0
    # The engine evicted it: b no longer attracts the conversation, a's guess does.
    index.apply(publishing.url, KvEventBatch(2, (CacheCleared(),)))
    assert p.select([guessed, publishing], RouteRequest(conversation)) is guessed


def test_the_tree_stays_within_its_page_bound() -> None:
    pool = workers(2)
    p = policy(max_pages=100)
    for i in range(30):
        route(p, pool, RouteRequest(prompt(i, 1000)))
    assert len(p.tree) == 100


def test_a_departed_worker_is_forgotten() -> None:
    pool = workers(2)
    p = policy()
    conversation = prompt(1, 800)
    home = route(p, pool, RouteRequest(conversation))
    p.on_workers_changed([w.url for w in pool if w is not home])
    assert p.tree.pages_of(home.url) == 0


def test_finished_requests_never_make_a_pool_look_imbalanced() -> None:
    # Loads reported once, idle, and never again; the popular prompt's home has been sent 100 requests since,
    # all finished. It is not overloaded: the next turn still goes home.
    pool = workers(3)
    for w in pool:
        w.load = report(0, 0, at=0.0)
    p = policy()
    conversation = prompt(1, 2000)
    home = route(p, pool, RouteRequest(conversation, now_s=1.0))
    for t in range(100):
        assert route(p, pool, RouteRequest(conversation, now_s=2.0 + t / 10)) is home
    assert p.select(pool, RouteRequest(conversation, now_s=20.0)) is home
