from __future__ import annotations

from node.routing.kv_events import (
    BlocksRemoved,
    BlocksStored,
    CacheCleared,
    KvEventBatch,
    SnapshotChunk,
    StoredBlock,
)
from node.routing.kv_index import KvIndex, Resubscribe

A, B = "grpc://a:1", "grpc://b:1"
IDS = list(range(100, 140))  # 10 blocks of 4


def blocks(first: int, count: int, ids: list[int] = IDS, hash_base: int = 0) -> tuple[StoredBlock, ...]:
    return tuple(
        StoredBlock(hash_base + first + i, tuple(ids[(first + i) * 4 : (first + i + 1) * 4])) for i in range(count)
    )


def stored(first: int, count: int, parent: int | None = None, **kw: object) -> BlocksStored:
    return BlocksStored(blocks(first, count, **kw), parent, 4)  # type: ignore[arg-type]


class Stream:
    """One worker's batches, numbered as a publisher numbers them."""

    def __init__(self, index: KvIndex, url: str) -> None:
        self.index, self.url, self.sequence = index, url, 0

    def send(self, *events: object, skip: int = 0) -> Resubscribe | None:
        self.sequence += 1 + skip
        return self.index.apply(self.url, KvEventBatch(self.sequence, events))  # type: ignore[arg-type]


def test_a_stored_chain_is_matched_block_by_block_and_extended_under_its_parent() -> None:
    index = KvIndex(1000)
    a = Stream(index, A)
    a.send(stored(0, 3))
    assert index.block_size == 4
    assert index.match(IDS[:14]) == {A: 3}  # 3 full blocks; the partial 4th is never cached
    assert index.match([*IDS[:8], 0, 0, 0, 0]) == {A: 2}
    assert index.match([1, 2, 3, 4, *IDS[4:]]) == {}
    a.send(stored(3, 2, parent=2))
    assert index.match(IDS) == {A: 5}


def test_each_worker_counts_only_its_own_leading_blocks() -> None:
    index = KvIndex(1000)
    Stream(index, A).send(stored(0, 6))
    Stream(index, B).send(stored(0, 2))
    assert index.match(IDS) == {A: 6, B: 2}
    assert index.blocks_of(A) == 6 and index.knows(B) and not index.knows("grpc://c:1")


def test_removed_and_cleared_blocks_stop_matching() -> None:
    index = KvIndex(1000)
    a = Stream(index, A)
    a.send(stored(0, 5))
    a.send(BlocksRemoved((2,)))
    assert index.match(IDS) == {A: 2}  # a worker's count stops at its first missing block
    a.send(CacheCleared())
    assert index.match(IDS) == {} and index.stats().blocks == 0 and index.stats().prefixes == 0


def test_a_block_cached_twice_stays_until_its_last_copy_goes() -> None:
    index = KvIndex(1000)
    a = Stream(index, A)
    a.send(stored(0, 2), stored(0, 2))  # device and host copies: same engine hashes
    a.send(stored(0, 2, hash_base=50))  # the same tokens under other engine hashes (extra keys)
    for engine_hash in (1, 51):
        a.send(BlocksRemoved((engine_hash,)))
        assert index.match(IDS) == {A: 2}
    a.send(BlocksRemoved((1,)))  # block 1's last copy
    assert index.match(IDS) == {A: 1}
    a.send(BlocksRemoved((0, 50, 0)))
    assert index.match(IDS) == {}
    assert index.stats().blocks == 0


def test_the_block_size_is_learned_and_other_sizes_or_unknown_parents_are_not_indexed() -> None:
    index = KvIndex(1000)
    a = Stream(index, A)
    a.send(BlocksStored((StoredBlock(1, (1, 2, 3, 4, 5, 6, 7, 8)),), None, 8))
    a.send(stored(0, 2))  # a 4-token block from a model indexed at 8
    a.send(BlocksStored((StoredBlock(2, (9, 9, 9, 9, 9, 9, 9, 9)),), 12345, 8))  # parent never seen
    assert index.block_size == 8
    assert index.match([1, 2, 3, 4, 5, 6, 7, 8]) == {A: 1}
    assert index.stats().orphan_blocks == 3


def test_repeats_are_ignored_and_a_gap_asks_to_resubscribe_from_the_last_applied_batch() -> None:
    index = KvIndex(1000)
    a = Stream(index, A)
    a.send(stored(0, 1))
    a.send(stored(1, 1, parent=0))
    assert index.apply(A, KvEventBatch(2, (CacheCleared(),))) is None  # a repeat: not applied
    assert index.apply(A, KvEventBatch(0, ())) is None  # a load-only record
    assert index.match(IDS) == {A: 2}
    gap = a.send(stored(2, 1, parent=1), skip=2)
    assert gap == Resubscribe(A, from_sequence=2, expected=3, received=5)
    assert index.lagging(A) and index.resume_from(A) == 2
    assert index.match(IDS) == {A: 2}  # the batch after the gap was not applied
    # Resubscribed from 2: the relay replays 3, 4, 5.
    a.sequence = 2
    for first in (2, 3, 4):
        assert a.send(stored(first, 1, parent=first - 1)) is None
    assert index.match(IDS) == {A: 5} and not index.lagging(A)
    assert index.stats().gaps == 1 and index.stats().duplicate_batches == 1


def test_a_snapshot_resynchronises_a_worker_that_fell_behind() -> None:
    index = KvIndex(1000)
    a = Stream(index, A)
    a.send(stored(0, 4))
    assert a.send(BlocksRemoved((3,)), skip=9) is not None
    # The relay's history no longer reaches 2: a snapshot in chunks numbered 2..4, chunk 0 clearing first.
    live = (stored(0, 2), stored(5, 1, parent=1))  # what the engine holds now (block 5 under block 1)
    chunks = [(CacheCleared(), *live), (), ()]
    for i, events in enumerate(chunks):
        chunk = SnapshotChunk(index=i, count=3, blocks=3, unknown_before=7)
        assert index.apply(A, KvEventBatch(2 + i, events, chunk)) is None  # type: ignore[arg-type]
    assert index.match(IDS) == {A: 2}
    assert index.match(IDS[:8] + IDS[20:24]) == {A: 3}
    assert index.resume_from(A) == 4 and index.partially_known(A)


def test_memory_is_bounded_by_evicting_the_largest_workers_oldest_blocks() -> None:
    index = KvIndex(128)
    ids = list(range(10_000, 10_000 + 4 * 200))
    a, b = Stream(index, A), Stream(index, B)
    b.send(BlocksStored(blocks(0, 20, ids, hash_base=0), None, 4))
    for start in range(0, 200, 20):  # a stores 200 blocks as one growing chain
        a.send(BlocksStored(blocks(start, 20, ids), start - 1 if start else None, 4))
    stats = index.stats()
    assert stats.blocks <= 128 and stats.evicted_blocks == 220 - stats.blocks
    assert index.blocks_of(B) == 20  # the smaller worker kept everything
    assert stats.bytes_estimate > 0


def test_load_only_records_do_not_make_a_worker_known() -> None:
    index = KvIndex(1000)
    assert index.apply(A, KvEventBatch(0, ())) is None
    assert not index.knows(A)


def test_a_forgotten_worker_is_never_reported_and_its_bit_is_reused() -> None:
    index = KvIndex(1000)
    Stream(index, A).send(stored(0, 3))
    index.forget_worker(A)
    assert index.match(IDS) == {} and not index.knows(A) and index.resume_from(A) == 0
    Stream(index, B).send(stored(0, 1))
    assert index.match(IDS) == {B: 1}
