from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from node.routing.block_hashes import BlockHashes, block_hash, leading_depths


def naive_prefixes(ids: list[int], size: int) -> list[int]:
    out, h = [], 0
    for i in range(len(ids) // size):
        h ^= block_hash(i, tuple(ids[i * size : (i + 1) * size]))
        out.append(h)
    return out


@settings(max_examples=60, deadline=None)
@given(
    ids=st.lists(st.integers(0, 2**32 - 1), max_size=300), size=st.integers(1, 20), cuts=st.lists(st.integers(0, 40))
)
def test_prefix_hashes_are_the_same_however_they_are_computed(ids: list[int], size: int, cuts: list[int]) -> None:
    expected = naive_prefixes(ids, size)
    hashes = BlockHashes(ids, size)
    for cut in cuts:  # any order of partial computations
        assert hashes.upto(cut) == expected[:cut]
    assert hashes.all() == expected
    assert hashes.full_blocks == len(ids) // size


def test_one_hash_names_one_exact_prefix() -> None:
    a, b = list(range(16)), list(range(16, 32))
    assert BlockHashes(a + b, 16).all()[1] != BlockHashes(b + a, 16).all()[1]  # order matters
    assert BlockHashes(a + b + [1, 2], 16).all() == BlockHashes(a + b, 16).all()  # a partial block is no block
    assert BlockHashes(a + b, 16).all()[0] == BlockHashes(a + [9] * 16, 16).all()[0]


@settings(max_examples=50, deadline=None)
@given(
    query=st.lists(st.integers(0, 2), max_size=120),
    held=st.lists(st.tuples(st.integers(0, 5), st.lists(st.integers(0, 2), max_size=120)), max_size=12),
)
def test_the_walk_counts_each_workers_leading_blocks_like_the_naive_loop(
    query: list[int], held: list[tuple[int, list[int]]]
) -> None:
    size = 4
    masks: dict[int, int] = {}
    for worker, ids in held:
        for h in naive_prefixes(ids, size):
            masks[h] = masks.get(h, 0) | 1 << worker
    expected = {}
    for worker in range(6):
        depth = 0
        for h in naive_prefixes(query, size):
            if not masks.get(h, 0) >> worker & 1:
                break
            depth += 1
        if depth:
            expected[worker] = depth
    assert leading_depths(BlockHashes(query, size), masks.get) == expected
