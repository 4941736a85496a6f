from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from node.routing.approx_tree import ApproxTree
from node.routing.block_hashes import BlockHashes
from tests.routing.helpers import prompt

SYSTEM = list(range(5000, 5064))


def hashes(ids: list[int]) -> BlockHashes:
    return BlockHashes(ids, 16)


def test_what_was_sent_where_is_matched_page_by_page() -> None:
    tree = ApproxTree(16, 1000)
    a, b = prompt(1, 200, prefix=SYSTEM), prompt(2, 100, prefix=SYSTEM)
    tree.insert(hashes(a), "A")
    tree.insert(hashes(b), "B")
    assert tree.match(hashes(a)) == {"A": 12, "B": 4}  # 200 tokens = 12 full pages; the system prompt is 4
    assert tree.match(hashes(prompt(3, 90))) == {}
    assert (tree.pages_of("A"), tree.pages_of("B"), len(tree)) == (12, 6, 4 + 8 + 2)


def test_least_recently_sent_prompts_are_evicted_first_and_counts_follow() -> None:
    tree = ApproxTree(16, 40)
    old, fresh = prompt(1, 320), prompt(2, 320)  # 20 pages each
    tree.insert(hashes(old), "A")
    tree.insert(hashes(fresh), "B")
    tree.insert(hashes(prompt(3, 160)), "A")  # 10 more pages: 10 of the oldest must go
    assert len(tree) == 40 and tree.evicted_pages == 10
    assert tree.match(hashes(old)) == {"A": 10}  # its tail went first
    assert tree.match(hashes(fresh)) == {"B": 20}
    assert (tree.pages_of("A"), tree.pages_of("B")) == (20, 20)


def test_a_departed_worker_is_forgotten_and_shared_pages_stay_for_the_others() -> None:
    tree = ApproxTree(16, 1000)
    tree.insert(hashes(prompt(1, 100, prefix=SYSTEM)), "A")
    tree.insert(hashes(prompt(2, 100, prefix=SYSTEM)), "B")
    tree.retain(["B"])
    assert tree.pages_of("A") == 0
    assert tree.match(hashes(prompt(1, 100, prefix=SYSTEM))) == {"B": 4}
    assert len(tree) == 6


@settings(max_examples=40, deadline=None)
@given(
    sends=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 6), st.integers(16, 200)), min_size=1, max_size=40),
    capacity=st.integers(1, 30),
)
def test_eviction_takes_leaves_only_and_stays_within_the_bound(
    sends: list[tuple[int, int, int]], capacity: int
) -> None:
    tree = ApproxTree(16, capacity)
    prompts = []
    for worker, family, length in sends:
        ids = prompt(family, length, prefix=SYSTEM[: 16 * (family % 3)])
        prompts.append(ids)
        tree.insert(hashes(ids), f"w{worker}")
        assert len(tree) <= capacity
    nodes = tree._nodes
    for ids in prompts:
        path = hashes(ids).all()
        present = [h in nodes for h in path]
        # Prefix-closed: a page is kept only while every page before it is.
        assert present == sorted(present, reverse=True)
    assert sum(tree.pages_of(f"w{w}") for w in range(4)) == sum(bin(m).count("1") for m in nodes.values())
