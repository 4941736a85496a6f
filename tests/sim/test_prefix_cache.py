"""The prefix cache: hits on chained block hashes, LRU eviction (tail first), pins, and its KV events."""

from __future__ import annotations

import pytest

from node.routing.kv_events import BlocksRemoved, BlocksStored, CacheCleared, StoredBlock
from node.sim.prefix_cache import CacheBusyError, PrefixCache, chain_hash

BS = 4


def tokens(start: int, count: int) -> list[int]:
    return list(range(start, start + count))


def test_block_hashes_chain_from_the_parent() -> None:
    cache = PrefixCache(BS, 16)
    prompt = tokens(0, 10)
    hashes = cache.block_hashes(prompt)
    assert len(hashes) == 2  # the trailing partial block has no hash
    assert hashes[0] == chain_hash(None, prompt[0:4])
    assert hashes[1] == chain_hash(hashes[0], prompt[4:8])
    # Same tokens under another parent hash differently: one hash names the whole prefix.
    assert cache.block_hashes([9, 9, 9, 9, *prompt[4:8]])[1] != hashes[1]
    assert all(-(2**63) <= h < 2**63 for h in hashes)


def test_first_admission_stores_the_prompt_and_misses() -> None:
    cache = PrefixCache(BS, 16)
    prompt = tokens(0, 10)
    admission = cache.admit(prompt)
    assert admission.cached_tokens == 0
    h0, h1 = cache.block_hashes(prompt)
    assert admission.events == (BlocksStored((StoredBlock(h0, (0, 1, 2, 3)), StoredBlock(h1, (4, 5, 6, 7))), None, BS),)
    assert cache.pinned_blocks == 2
    cache.release(admission.lease)
    assert cache.pinned_blocks == 0
    assert cache.cached_blocks == 2


def test_shared_prefix_hits_and_only_new_blocks_are_stored() -> None:
    cache = PrefixCache(BS, 16)
    first = cache.admit(tokens(0, 10))
    cache.release(first.lease)
    second_prompt = [*tokens(0, 8), 50, 51, 52, 53, 54]
    second = cache.admit(second_prompt)
    assert second.cached_tokens == 8
    h = cache.block_hashes(second_prompt)
    assert second.events == (BlocksStored((StoredBlock(h[2], (50, 51, 52, 53)),), h[1], BS),)
    assert cache.cached_prefix_tokens(second_prompt) == 12  # now stored: (13 - 1) // 4 whole blocks


def test_a_fully_cached_prompt_still_computes_its_last_token() -> None:
    cache = PrefixCache(BS, 16)
    prompt = tokens(0, 8)
    cache.release(cache.admit(prompt).lease)
    again = cache.admit(prompt)
    assert again.cached_tokens == 4  # (8 - 1) // 4 blocks
    assert again.events == ()


def test_lru_evicts_unpinned_blocks_tail_first() -> None:
    cache = PrefixCache(BS, 3)
    a = cache.admit(tokens(0, 8))  # blocks a0, a1
    cache.release(a.lease)
    a0, a1 = cache.block_hashes(tokens(0, 8))
    b = cache.admit(tokens(100, 8))  # needs 2 blocks, 1 free: evicts a's tail a1 first
    assert b.events[0] == BlocksRemoved((a1,))
    assert isinstance(b.events[1], BlocksStored)
    assert cache.cached_prefix_tokens([*tokens(0, 4), 99]) == 4  # a0 survived
    cache.release(b.lease)
    c = cache.admit(tokens(200, 5))  # one block: the least recently used is a0 now
    assert c.events[0] == BlocksRemoved((a0,))


def test_pinned_blocks_are_never_evicted_and_a_full_cache_stops_storing() -> None:
    cache = PrefixCache(BS, 2)
    held = cache.admit(tokens(0, 8))  # pins both blocks
    other = cache.admit(tokens(100, 8))
    assert other.events == ()
    assert other.cached_tokens == 0
    assert cache.cached_blocks == 2
    cache.release(other.lease)
    cache.release(held.lease)
    assert cache.pinned_blocks == 0


def test_hits_touch_blocks_so_hot_prefixes_survive() -> None:
    cache = PrefixCache(BS, 3)
    hot = tokens(0, 5)
    cache.release(cache.admit(hot).lease)
    cache.release(cache.admit(tokens(100, 5)).lease)
    cache.release(cache.admit(hot).lease)  # touch the hot block again
    cache.release(cache.admit(tokens(200, 5)).lease)
    cache.release(cache.admit(tokens(300, 5)).lease)  # evicts the coldest: block 100
    assert cache.cached_prefix_tokens(hot) == 4
    assert cache.cached_prefix_tokens(tokens(100, 5)) == 0


def test_extend_caches_output_blocks_after_the_prompt() -> None:
    cache = PrefixCache(BS, 16)
    prompt = tokens(0, 6)
    admission = cache.admit(prompt)
    events = cache.extend(admission.lease, [*prompt, 90, 91, 92, 93, 94])
    h = cache.block_hashes([*prompt, 90, 91, 92, 93, 94])
    assert events == (BlocksStored((StoredBlock(h[1], (4, 5, 90, 91)),), h[0], BS),)
    cache.release(admission.lease)
    # A follow-up turn that repeats the answer hits it.
    assert cache.cached_prefix_tokens([*prompt, 90, 91, 92, 93, 94, 95]) == 8


def test_zero_capacity_caches_nothing() -> None:
    cache = PrefixCache(BS, 0)
    admission = cache.admit(tokens(0, 20))
    assert admission.events == ()
    assert admission.cached_tokens == 0
    assert cache.cached_blocks == 0
    assert not cache.enabled and cache.block_hashes(tokens(0, 20)) == []  # nor hashes anything


def test_clear_refuses_while_pinned_then_clears() -> None:
    cache = PrefixCache(BS, 16)
    admission = cache.admit(tokens(0, 9))
    with pytest.raises(CacheBusyError):
        cache.clear()
    cache.release(admission.lease)
    assert cache.clear() == (CacheCleared(),)
    assert cache.cached_blocks == 0


def test_live_blocks_list_parents_before_children() -> None:
    cache = PrefixCache(BS, 16)
    cache.release(cache.admit(tokens(0, 12)).lease)
    cache.release(cache.admit([*tokens(0, 4), 70, 71, 72, 73, 74]).lease)
    live = cache.live_blocks()
    assert len(live) == 4
    seen: set[int] = set()
    for stored in live:
        assert stored.parent_block_hash is None or stored.parent_block_hash in seen
        seen.update(b.block_hash for b in stored.blocks)
