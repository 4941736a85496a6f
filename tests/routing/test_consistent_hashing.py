from __future__ import annotations

import os
import random
import subprocess
import sys
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from node.routing.consistent_hashing import ConsistentHashing
from node.routing.policy import RouteRequest
from node.routing.ring import HashRing, ring_hash
from tests.routing.helpers import FakeWorker, workers

KEYS = [f"session-{i}" for i in range(4000)]


def policy(urls: list[str]) -> ConsistentHashing:
    p = ConsistentHashing(random.Random(3), virtual_nodes=150)
    p.on_workers_changed(urls)
    return p


def assignment(p: ConsistentHashing, pool: list[FakeWorker], keys: list[str] = KEYS) -> dict[str, str]:
    return {key: p.select(pool, RouteRequest([1], key)).url for key in keys}


def test_a_key_always_goes_to_the_same_worker_and_keys_spread_evenly() -> None:
    pool = workers(4)
    p = policy([w.url for w in pool])
    first = assignment(p, pool)
    assert assignment(p, pool) == first
    shares = Counter(first.values())
    assert all(0.17 < shares[w.url] / len(KEYS) < 0.33 for w in pool)


def test_adding_a_fifth_worker_moves_about_a_fifth_of_the_keys_all_to_it() -> None:
    pool = workers(5)
    before = assignment(policy([w.url for w in pool[:4]]), pool[:4])
    after = assignment(policy([w.url for w in pool]), pool)
    moved = [key for key in KEYS if before[key] != after[key]]
    assert 0.13 < len(moved) / len(KEYS) < 0.27
    assert {after[key] for key in moved} == {pool[4].url}


def test_an_unhealthy_workers_keys_move_and_come_back_and_no_other_key_moves() -> None:
    pool = workers(4)
    p = policy([w.url for w in pool])
    before = assignment(p, pool)
    during = assignment(p, pool[1:])  # w0 out of rotation, still configured
    assert all(during[k] == before[k] for k in KEYS if before[k] != pool[0].url)
    assert all(during[k] != pool[0].url for k in KEYS)
    assert assignment(p, pool) == before


def test_a_request_without_a_key_goes_to_a_random_worker() -> None:
    pool = workers(3)
    p = policy([w.url for w in pool])
    counts = Counter(p.select(pool, RouteRequest([1])).url for _ in range(900))
    assert all(counts[w.url] > 200 for w in pool)


def test_a_candidate_the_pool_never_announced_is_still_reachable() -> None:
    pool = workers(3)
    p = policy([pool[0].url])
    assert set(assignment(p, pool, KEYS[:300]).values()) == {w.url for w in pool}


def test_keys_map_alike_in_every_process() -> None:
    # Another gateway node (another process, another str-hash salt) must send a key to the same worker.
    urls = ["grpc://a:1", "grpc://b:1", "grpc://c:1"]
    script = (
        "from node.routing.ring import HashRing, ring_hash\n"
        f"ring = HashRing(150, {urls!r})\n"
        "print([ring.find(ring_hash(f'session-{i}'.encode()), lambda _: True) for i in range(200)])\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    ring = HashRing(150, list(reversed(urls)))
    here = [ring.find(ring_hash(f"session-{i}".encode()), lambda _: True) for i in range(200)]
    assert out.stdout.strip() == str(here)


@settings(max_examples=20, deadline=None)
@given(
    urls=st.sets(st.integers(0, 10_000).map(lambda i: f"grpc://h{i}:1"), min_size=2, max_size=9),
    keys=st.lists(st.text(min_size=1, max_size=12), min_size=30, max_size=100, unique=True),
    data=st.data(),
)
def test_a_joining_or_leaving_worker_moves_only_its_own_keys(urls: set[str], keys: list[str], data) -> None:
    members = sorted(urls)
    leaving = data.draw(st.sampled_from(members))
    rest = [u for u in members if u != leaving]
    full, without = HashRing(40, members), HashRing(40, rest)

    def owner(ring: HashRing, key: str) -> str | None:
        return ring.find(ring_hash(key.encode()), lambda _: True)

    for key in keys:
        a, b = owner(full, key), owner(without, key)
        # Leaving moves exactly the leaver's keys; joining (read backwards) moves keys only to the joiner.
        assert (a == b) == (a != leaving)
