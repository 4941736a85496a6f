"""Cache-affinity hints: what one node learns from routing reaches another and steers its cache_aware."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from node.routing.affinity import AffinityHints, hint_depths
from node.routing.block_hashes import BlockHashes
from node.routing.cache_aware import CacheAware
from node.routing.policy import RouteRequest
from tests.routing.helpers import FakeWorker

PAGE = 4


def hints(clock: list[float] | None = None, **kw: int) -> AffinityHints:
    t = clock if clock is not None else [0.0]
    return AffinityHints(
        PAGE,
        ttl_s=kw.get("ttl", 100),
        max_entries=kw.get("max_entries", 10_000),
        max_message_bytes=kw.get("max_bytes", 1000),
        clock=lambda: t[0],
    )


def ship(src: AffinityHints, dst: AffinityHints) -> None:
    for msg in src.take_outgoing():
        assert len(msg) <= 1000
        dst.receive(msg)


def test_depths_are_powers_of_two_and_the_last_page() -> None:
    assert hint_depths(0) == [] and hint_depths(1) == [1] and hint_depths(5) == [1, 2, 4, 5]
    assert hint_depths(8) == [1, 2, 4, 8]


@settings(max_examples=60, deadline=None)
@given(
    prompts=st.lists(st.lists(st.integers(0, 50_000), min_size=PAGE, max_size=200), min_size=1, max_size=30),
    urls=st.lists(st.sampled_from(["grpc://a:1", "grpc://b:2", "grpc://c:3"]), min_size=30, max_size=30),
)
def test_a_peer_matches_what_the_origin_learned(prompts: list[list[int]], urls: list[str]) -> None:
    origin, peer = hints(), hints()
    expected: dict[int, tuple[str, list[int]]] = {}
    for prompt, url in zip(prompts, urls, strict=False):
        origin.learn(BlockHashes(prompt, 16), url)
        expected[len(expected)] = (url, prompt)
    ship(origin, peer)
    for _url, prompt in expected.values():
        # A follow-up turn extends the prompt: the peer finds at least the whole earlier prompt's pages
        # with the worker that was last sent that prefix.
        longer = [*prompt, 7, 7, 7, 7, 7]
        got = peer.match(BlockHashes(longer, 16))
        full = len(prompt) // PAGE * PAGE
        holders = {u for u, p in expected.values() if len(p) >= full and p[:full] == prompt[:full]}
        deep = {u for u, tokens in got.items() if tokens >= full}
        assert deep and deep <= holders, (got, holders, full)
    assert origin.match(BlockHashes([1, 2], 16)) == {}


def test_hints_age_out_and_stay_bounded() -> None:
    clock = [0.0]
    h = hints(clock, ttl=10, max_entries=50)
    for i in range(100):
        h.learn(BlockHashes(list(range(i, i + 8)), 16), "grpc://a:1")
    assert len(h) <= 50
    prompt = list(range(1000, 1016))
    h.learn(BlockHashes(prompt, 16), "grpc://b:2")
    assert h.match(BlockHashes(prompt, 16)) == {"grpc://b:2": 16}
    clock[0] = 11.0
    assert h.match(BlockHashes(prompt, 16)) == {}, "an expired hint still steered routing"


def test_known_hints_are_not_resent_and_garbage_is_rejected() -> None:
    h, peer = hints(), hints()
    prompt = list(range(64))
    h.learn(BlockHashes(prompt, 16), "grpc://a:1")
    assert len(h.take_outgoing()) == 1
    h.learn(BlockHashes(prompt, 16), "grpc://a:1")
    assert h.take_outgoing() == []
    h.learn(BlockHashes(prompt, 16), "grpc://b:2")  # a different worker now holds it: news
    msgs = h.take_outgoing()
    assert msgs
    for bad in (b"", b"\x02" + msgs[0][1:], msgs[0][:-3], msgs[0][:12] + b"\xff" + msgs[0][13:]):
        peer.receive(bad)
    assert peer.rejected == 4 and len(peer) == 0
    other_page = AffinityHints(8, ttl_s=1, max_entries=10, max_message_bytes=1000)
    other_page.receive(msgs[0])
    assert other_page.rejected == 1


def test_many_hints_split_into_bounded_messages() -> None:
    h, peer = hints(max_bytes=200), hints()
    rng = random.Random(1)
    for i in range(50):
        h.learn(BlockHashes([rng.randrange(1000) for _ in range(40)], 16), f"grpc://w{i % 7}:1")
    msgs = h.take_outgoing()
    assert len(msgs) > 1 and all(len(m) <= 200 for m in msgs)
    for m in msgs:
        peer.receive(m)
    assert peer.received == h.sent and peer.rejected == 0


def test_cache_aware_follows_another_nodes_decision() -> None:
    workers = [FakeWorker(f"grpc://w{i}:1") for i in range(4)]
    shared_a, shared_b = hints(), hints()

    def policy(h: AffinityHints) -> CacheAware:
        return CacheAware(
            cache_threshold=0.5,
            balance_abs_threshold=64,
            balance_rel_threshold=1.5,
            page_size_tokens=PAGE,
            tree_max_pages=10_000,
            load_stale_after_s=5,
            hints=h,
        )

    node_a, node_b = policy(shared_a), policy(shared_b)
    for p in (node_a, node_b):
        p.on_workers_changed([w.url for w in workers])
    for k in range(3):  # fill w0..w2 so the first turn lands on w3, which node b would never pick blind
        other = RouteRequest(prompt_ids=[5000 + k] * 64)
        node_a.on_routed(node_a.select(workers, other), other)
    turn1 = RouteRequest(prompt_ids=list(range(100, 300)))
    chosen = node_a.select(workers, turn1)
    assert chosen is workers[3]
    node_a.on_routed(chosen, turn1)
    ship(shared_a, shared_b)
    turn2 = RouteRequest(prompt_ids=[*range(100, 300), *range(900, 940)])
    for _ in range(3):
        assert node_b.select(workers, turn2) is chosen, "node b ignored node a's routing of the first turn"
