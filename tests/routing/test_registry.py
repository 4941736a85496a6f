"""Every policy by name, and the contract every policy keeps: it returns one of the healthy candidates."""

from __future__ import annotations

import random
from typing import get_args

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from node.routing.config import PolicyName, RoutingConfig
from node.routing.kv_index import KvIndex
from node.routing.policy import RouteRequest
from node.routing.registry import POLICY_NAMES, make_policy
from tests.routing.helpers import FakeWorker, report

URLS = [f"grpc://w{i}:1" for i in range(6)]


def test_every_policy_name_builds_a_policy_of_that_name() -> None:
    assert set(POLICY_NAMES) == set(get_args(PolicyName))
    for name in POLICY_NAMES:
        assert make_policy(name, RoutingConfig(policy=name)).name == name


def test_an_unknown_name_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="'fastest'"):
        make_policy("fastest", RoutingConfig())


step = st.tuples(
    st.sets(st.sampled_from(URLS), min_size=1),  # healthy candidates
    st.one_of(st.none(), st.sampled_from(["alice", "bob", "carol", ""])),  # routing key
    st.lists(st.integers(0, 3), max_size=80),  # prompt ids from a tiny vocabulary: prefixes collide
    st.lists(st.one_of(st.none(), st.integers(0, 200)), min_size=6, max_size=6),  # reported load per worker
    st.integers(0, 5),  # in flight
    st.booleans(),  # announce a new configured set first
)


@pytest.mark.parametrize("name", POLICY_NAMES)
@settings(max_examples=12, deadline=None)
@given(steps=st.lists(step, min_size=1, max_size=15), seed=st.integers(0, 2**16))
def test_the_choice_is_always_one_of_the_candidates(name: str, steps: list, seed: int) -> None:
    config = RoutingConfig(policy=name, page_size_tokens=4, tree_max_pages=16, manual_max_entries=2)
    policy = make_policy(name, config, rng=random.Random(seed), kv_index=KvIndex(64))
    workers = {url: FakeWorker(url) for url in URLS}
    for now, (healthy, key, ids, loads, in_flight, announce) in enumerate(steps):
        if announce:
            policy.on_workers_changed(sorted(healthy))
        for url, load in zip(URLS, loads, strict=True):
            workers[url].load = None if load is None else report(load, load // 2, at=float(now))
            workers[url].in_flight = in_flight
        candidates = [workers[url] for url in sorted(healthy)]
        request = RouteRequest(ids, key, now_s=float(now))
        chosen = policy.select(candidates, request)
        assert any(chosen is c for c in candidates)
        policy.on_routed(chosen, request)
