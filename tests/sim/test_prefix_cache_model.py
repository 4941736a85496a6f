"""The prefix cache against a reference model, and its cost under long concurrent prompts.

The reference is the obvious implementation: one LRU over every block, eviction walking it for the first
unpinned block. The cache must behave exactly like it (same hits, events, leases, evictions) while never
walking the cache: its eviction is O(1), so 16 concurrent long prompts do not make the engine the bottleneck.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from node.routing.kv_events import BlocksRemoved, BlocksStored, KvEvent, StoredBlock
from node.sim.prefix_cache import PrefixCache, chain_hash

BS = 2


@dataclass
class _Block:
    parent: int | None
    token_ids: tuple[int, ...]
    refs: int = 0


class ReferenceCache:
    """Every block in one LRU, least recently used first; eviction takes the first unpinned one."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.blocks: OrderedDict[int, _Block] = OrderedDict()

    def hashes(self, token_ids: Sequence[int]) -> list[int]:
        out: list[int] = []
        for start in range(0, len(token_ids) - BS + 1, BS):
            out.append(chain_hash(out[-1] if out else None, token_ids[start : start + BS]))
        return out

    def admit(self, token_ids: Sequence[int]) -> tuple[int, list[int], list[KvEvent]]:
        hashes = self.hashes(token_ids)
        matched = 0
        for h in hashes[: max(0, len(token_ids) - 1) // BS]:
            if h not in self.blocks:
                break
            matched += 1
        lease = hashes[:matched]
        for h in lease:
            self.blocks[h].refs += 1
        return matched * BS, lease, self.store(lease, token_ids, hashes)

    def store(self, lease: list[int], token_ids: Sequence[int], hashes: list[int]) -> list[KvEvent]:
        removed: list[int] = []
        runs: list[BlocksStored] = []
        run: list[StoredBlock] = []
        run_parent: int | None = None
        for position in range(len(lease), len(hashes)):
            h = hashes[position]
            parent = lease[-1] if lease else None
            if h in self.blocks:
                if run:
                    runs.append(BlocksStored(tuple(run), run_parent, BS))
                    run = []
            else:
                if len(self.blocks) >= self.capacity:
                    victim = next((v for v, block in self.blocks.items() if block.refs == 0), None)
                    if victim is None:
                        break
                    del self.blocks[victim]
                    removed.append(victim)
                tokens = tuple(token_ids[position * BS : (position + 1) * BS])
                self.blocks[h] = _Block(parent, tokens)
                if not run:
                    run_parent = parent
                run.append(StoredBlock(h, tokens))
            self.blocks[h].refs += 1
            lease.append(h)
        if run:
            runs.append(BlocksStored(tuple(run), run_parent, BS))
        return ([BlocksRemoved(tuple(removed))] if removed else []) + list(runs)

    def release(self, lease: list[int]) -> None:
        for h in reversed(lease):
            self.blocks[h].refs -= 1
            self.blocks.move_to_end(h)
        lease.clear()


# Few distinct tokens and short prompts: prompts share prefixes, blocks repeat, the cache fills and evicts.
_prompt = st.lists(st.integers(0, 2), min_size=0, max_size=9)
_op = st.one_of(
    st.tuples(st.just("admit"), _prompt),
    st.tuples(st.just("finish"), st.integers(0, 7), st.lists(st.integers(0, 2), max_size=5)),
    st.tuples(st.just("peek"), _prompt),
)


@settings(max_examples=300, deadline=None)
@given(capacity=st.integers(0, 8), ops=st.lists(_op, max_size=40))
def test_cache_behaves_like_the_reference_model(capacity: int, ops: list[tuple[object, ...]]) -> None:
    cache = PrefixCache(BS, capacity)
    model = ReferenceCache(capacity)
    running: list[tuple[object, list[int], list[int]]] = []  # (lease, model lease, prompt)
    for op in ops:
        if op[0] == "admit":
            prompt = list(op[1])  # type: ignore[call-overload]
            admission = cache.admit(prompt)
            cached, model_lease, events = model.admit(prompt)
            assert (admission.cached_tokens, list(admission.events)) == (cached, events)
            assert admission.lease.pinned == model_lease
            running.append((admission.lease, model_lease, prompt))
        elif op[0] == "finish" and running:
            lease, model_lease, prompt = running.pop(op[1] % len(running))  # type: ignore[operator]
            full = prompt + list(op[2])  # type: ignore[call-overload]
            events = cache.extend(lease, full)  # type: ignore[arg-type]
            assert list(events) == model.store(model_lease, full, model.hashes(full))
            assert lease.pinned == model_lease  # type: ignore[attr-defined]
            cache.release(lease)  # type: ignore[arg-type]
            model.release(model_lease)
        elif op[0] == "peek":
            prompt = list(op[1])  # type: ignore[call-overload]
            hashes = model.hashes(prompt)
            expected = 0
            for h in hashes[: max(0, len(prompt) - 1) // BS]:
                if h not in model.blocks:
                    break
                expected += BS
            assert cache.cached_prefix_tokens(prompt) == expected
        assert cache.cached_blocks == len(model.blocks)
        assert cache.pinned_blocks == sum(1 for b in model.blocks.values() if b.refs)
        live = {stored.blocks[0].block_hash for stored in cache.live_blocks()}
        assert live == set(model.blocks)


def test_eviction_cost_does_not_grow_with_pinned_blocks() -> None:
    """16 running long prompts pin ~all of a large cache; one more request must not walk those pins.

    With the reference model's scan this is ~200 ms per request (each of ~500 evictions walks ~7,800 pinned
    blocks); with O(1) eviction it is the request's own hashing, ~1 ms. The bound leaves room for a slow CI.
    """
    capacity, prompt_blocks, concurrent = 8192, 487, 16  # the sim's default capacity, 7,800-token prompts
    cache = PrefixCache(16, capacity)
    running = []
    next_token = 0

    def prompt() -> list[int]:
        nonlocal next_token
        next_token += prompt_blocks * 16
        return list(range(next_token - prompt_blocks * 16, next_token))

    for _ in range(3 * concurrent):
        running.append(cache.admit(prompt()).lease)
        if len(running) > concurrent:
            cache.release(running.pop(0))
    assert cache.pinned_blocks >= concurrent * prompt_blocks * 0.9
    requests = 20
    start = time.process_time()
    for _ in range(requests):
        running.append(cache.admit(prompt()).lease)
        cache.release(running.pop(0))
    per_request_ms = (time.process_time() - start) / requests * 1000
    assert per_request_ms < 20, f"{per_request_ms:.1f} ms per request"
