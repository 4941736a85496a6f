"""The KV index against a naive model of what each engine caches, and against the simulated engine's own cache."""

from __future__ import annotations

import random
from collections import Counter

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from node.routing.kv_events import (
    BlocksRemoved,
    BlocksStored,
    CacheCleared,
    KvEvent,
    KvEventBatch,
    StoredBlock,
)
from node.routing.kv_index import KvIndex, Resubscribe
from node.sim import kv_events as sim_events
from node.sim.prefix_cache import PrefixCache

SIZE = 2
WORKERS = ["grpc://a:1", "grpc://b:1", "grpc://c:1"]
Path = tuple[tuple[int, ...], ...]


class EngineModel:
    """What one engine caches, the naive way: each engine block is a full token path, with copies."""

    def __init__(self) -> None:
        self.paths: dict[int, Path] = {}
        self.copies: Counter[int] = Counter()

    def apply(self, event: KvEvent) -> None:
        if isinstance(event, CacheCleared):
            self.paths.clear()
            self.copies.clear()
        elif isinstance(event, BlocksRemoved):
            for h in event.block_hashes:
                if self.copies[h]:
                    self.copies[h] -= 1
                    if not self.copies[h]:
                        del self.copies[h], self.paths[h]
        else:
            if event.parent_block_hash is None:
                path: Path = ()
            elif event.parent_block_hash in self.paths:
                path = self.paths[event.parent_block_hash]
            else:
                return  # a parent the subscriber never saw: nothing of the chain is known
            for block in event.blocks:
                path = (*path, block.token_ids)
                self.paths[block.block_hash] = path
                self.copies[block.block_hash] += 1

    def leading_blocks(self, ids: list[int]) -> int:
        held = set(self.paths.values())
        blocks = [tuple(ids[i : i + SIZE]) for i in range(0, len(ids) - SIZE + 1, SIZE)]
        depth = 0
        while depth < len(blocks) and tuple(blocks[: depth + 1]) in held:
            depth += 1
        return depth


def engine_hash(path: Path, salt: int) -> int:
    # Like an engine: a block's hash names its whole path (and any extra keys, the salt).
    return hash((salt, path)) & ((1 << 62) - 1)


tokens = st.integers(0, 2)  # a tiny vocabulary: the same block at the same position under different prefixes
block = st.tuples(tokens, tokens)


class IndexMachine(RuleBasedStateMachine):
    @initialize()
    def start(self) -> None:
        self.index = KvIndex(max_blocks=10_000)
        self.models = {url: EngineModel() for url in WORKERS}
        self.sequence = dict.fromkeys(WORKERS, 0)

    def send(self, url: str, *events: KvEvent) -> None:
        self.sequence[url] += 1
        assert self.index.apply(url, KvEventBatch(self.sequence[url], events)) is None
        for event in events:
            self.models[url].apply(event)

    @rule(url=st.sampled_from(WORKERS), data=st.data(), new=st.lists(block, min_size=1, max_size=4))
    def store(self, url: str, data: st.DataObject, new: list[tuple[int, ...]]) -> None:
        model = self.models[url]
        choice = data.draw(st.sampled_from([None, "unknown", *sorted(model.paths)]))
        salt = data.draw(st.integers(0, 1))
        parent = 987654321 if choice == "unknown" else choice
        path: Path = () if parent is None or parent == 987654321 else model.paths[parent]
        chain = []
        for tokens_ in new:
            path = (*path, tokens_)
            chain.append(StoredBlock(engine_hash(path, salt), tokens_))
        self.send(url, BlocksStored(tuple(chain), parent, SIZE))  # type: ignore[arg-type]

    @precondition(lambda self: any(m.paths for m in self.models.values()))
    @rule(url=st.sampled_from(WORKERS), data=st.data())
    def remove(self, url: str, data: st.DataObject) -> None:
        known = sorted(self.models[url].paths) or [1]
        hashes = data.draw(st.lists(st.sampled_from([*known, 424242]), min_size=1, max_size=3))
        self.send(url, BlocksRemoved(tuple(hashes)))

    @rule(url=st.sampled_from(WORKERS))
    def clear(self, url: str) -> None:
        self.send(url, CacheCleared())

    @rule(url=st.sampled_from(WORKERS), skip=st.integers(1, 3))
    def lose_batches(self, url: str, skip: int) -> None:
        cursor = self.sequence[url]
        if cursor == 0:
            return  # a fresh subscription accepts any first batch
        answer = self.index.apply(url, KvEventBatch(cursor + 1 + skip, (CacheCleared(),)))
        assert answer == Resubscribe(url, cursor, cursor + 1, cursor + 1 + skip)
        assert self.index.resume_from(url) == cursor  # and nothing was applied

    @rule(url=st.sampled_from(WORKERS))
    def repeat_a_batch(self, url: str) -> None:
        if self.sequence[url]:
            assert self.index.apply(url, KvEventBatch(self.sequence[url], (CacheCleared(),))) is None

    @rule(data=st.data(), tail=st.lists(tokens, max_size=7))
    def query(self, data: st.DataObject, tail: list[int]) -> None:
        paths = sorted({p for m in self.models.values() for p in m.paths.values()})
        base = data.draw(st.sampled_from(paths)) if paths else ()
        ids = [t for b in base for t in b] + tail
        expected = {url: d for url, m in self.models.items() if (d := m.leading_blocks(ids))}
        assert self.index.match(ids) == expected

    @invariant()
    def counts_agree(self) -> None:
        if not hasattr(self, "index"):
            return
        for url, model in self.models.items():
            assert self.index.blocks_of(url) == sum(model.copies.values())
        assert self.index.stats().blocks == sum(sum(m.copies.values()) for m in self.models.values())


TestIndexAgainstModel = IndexMachine.TestCase
TestIndexAgainstModel.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)


def convert(event: sim_events.KvEvent) -> KvEvent:
    """The subscriber's mapping, on the simulated engine's events (the same shapes as the proto's)."""
    if isinstance(event, sim_events.BlocksStored):
        blocks = tuple(StoredBlock(b.block_hash, tuple(b.token_ids)) for b in event.blocks)
        return BlocksStored(blocks, event.parent_block_hash, event.block_size)
    if isinstance(event, sim_events.BlocksRemoved):
        return BlocksRemoved(tuple(event.block_hashes))
    return CacheCleared()


def test_the_index_matches_what_the_simulated_engines_actually_cache() -> None:
    rng = random.Random(4)
    systems = [[rng.randrange(1000) for _ in range(64)] for _ in range(3)]
    caches = {url: PrefixCache(block_size=16, capacity_blocks=60) for url in WORKERS}
    index = KvIndex(max_blocks=10_000)
    sequence = Counter[str]()
    prompts = []
    for _ in range(120):
        url = rng.choice(WORKERS)
        ids = rng.choice(systems)[: rng.randrange(0, 65)] + [rng.randrange(1000) for _ in range(rng.randrange(40))]
        prompts.append(ids)
        admission = caches[url].admit(ids)
        caches[url].release(admission.lease)
        if admission.events:
            sequence[url] += 1
            index.apply(url, KvEventBatch(sequence[url], tuple(map(convert, admission.events))))
    for ids in prompts:
        expected = {}
        for url, cache in caches.items():
            live = {s.blocks[0].block_hash for s in cache.live_blocks()}
            depth = 0
            for h in cache.block_hashes(ids):
                if h not in live:
                    break
                depth += 1
            if depth:
                expected[url] = depth
        assert index.match(ids) == expected
