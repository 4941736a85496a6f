"""A prefix cache over full token blocks, with LRU eviction and the KV events a real engine publishes.

Pure. Block hashes chain from the parent (a hash over the parent's hash and the block's token ids), so one
hash names a whole prefix, like vLLM's. A request leases the blocks it uses: leased blocks are pinned and
never evicted. Unpinned blocks are evicted least recently used first; a released chain is touched from its
tail to its root, so a chain's tail goes before its root (vLLM frees blocks in reverse order for the same
reason). When every block is pinned, new blocks are not cached (the chain stops there).

Cost: the engine must never be the bottleneck, so no operation walks the cache. Unpinned blocks sit in their
own LRU (``_unpinned``, vLLM's free-block queue): pinning takes a block out, the last unpin puts it back at
the most recent end, eviction pops the least recent one, all O(1). A request costs O(its own blocks).
Invariant: ``_unpinned`` holds exactly the cached blocks with ``refs == 0``, least recently released first.
"""

from __future__ import annotations

import hashlib
import struct
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from node.routing.kv_events import BlocksRemoved, BlocksStored, CacheCleared, KvEvent, StoredBlock

_ROOT_MARKER = b"\x00root"


class CacheBusyError(Exception):
    """The cache cannot be cleared while requests hold blocks."""


def chain_hash(parent: int | None, token_ids: Sequence[int]) -> int:
    """The signed 64-bit hash of a block (the proto's int64) given its parent's hash."""
    digest = hashlib.blake2b(digest_size=8)
    digest.update(_ROOT_MARKER if parent is None else struct.pack("<q", parent))
    digest.update(array("I", token_ids).tobytes())
    return int.from_bytes(digest.digest(), "little", signed=True)


@dataclass(slots=True)
class Lease:
    """The chain of block hashes one sequence holds pinned, root first."""

    pinned: list[int] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Admission:
    cached_tokens: int
    lease: Lease
    events: tuple[KvEvent, ...]


@dataclass(slots=True)
class _Entry:
    parent: int | None
    token_ids: tuple[int, ...]
    depth: int
    refs: int = 0


class PrefixCache:
    def __init__(self, block_size: int, capacity_blocks: int) -> None:
        if block_size < 1 or capacity_blocks < 0:
            raise ValueError("block_size must be >= 1 and capacity_blocks >= 0")
        self._block_size = block_size
        self._capacity = capacity_blocks
        self._blocks: dict[int, _Entry] = {}
        # The blocks no lease holds, least recently released (or stored) first: the eviction order.
        self._unpinned: OrderedDict[int, None] = OrderedDict()

    @property
    def block_size(self) -> int:
        return self._block_size

    @property
    def enabled(self) -> bool:
        """A cache of 0 blocks stores nothing, so it hashes nothing either (a benchmark's engine runs so)."""
        return self._capacity > 0

    @property
    def capacity_blocks(self) -> int:
        return self._capacity

    @property
    def cached_blocks(self) -> int:
        return len(self._blocks)

    @property
    def pinned_blocks(self) -> int:
        return len(self._blocks) - len(self._unpinned)

    def block_hashes(self, token_ids: Sequence[int], *, start_block: int = 0, parent: int | None = None) -> list[int]:
        """Hashes of the full blocks of ``token_ids``; a trailing partial block has none.

        From block ``start_block`` on, whose parent's hash is ``parent`` (a chain already hashed up to there).
        """
        hashes: list[int] = []
        if not self._capacity:
            return hashes  # nothing is ever stored: no block can match
        size = self._block_size
        for start in range(start_block * size, len(token_ids) - size + 1, size):
            parent = chain_hash(parent, token_ids[start : start + size])
            hashes.append(parent)
        return hashes

    def cached_prefix_tokens(self, token_ids: Sequence[int], hashes: Sequence[int] | None = None) -> int:
        """The tokens ``admit`` would serve from cache right now, without touching anything.

        ``hashes``: ``block_hashes(token_ids)`` when the caller keeps them (they never change).
        """
        if hashes is None:
            hashes = self.block_hashes(token_ids)
        return self._match(token_ids, hashes) * self._block_size

    def admit(self, token_ids: Sequence[int], hashes: Sequence[int] | None = None) -> Admission:
        """Serve the longest cached prefix of a prompt, then cache the prompt's other full blocks.

        At most ``len(token_ids) - 1`` tokens count as cached (in whole blocks): the engine must compute the
        last prompt token to sample the first output token, as vLLM does. ``hashes`` as for
        ``cached_prefix_tokens``.
        """
        if hashes is None:
            hashes = self.block_hashes(token_ids)
        matched = self._match(token_ids, hashes)
        lease = Lease()
        for block_hash in hashes[:matched]:
            self._pin(block_hash)
            lease.pinned.append(block_hash)
        events = self._store(lease, token_ids, hashes, 0)
        return Admission(matched * self._block_size, lease, events)

    def extend(self, lease: Lease, token_ids: Sequence[int]) -> tuple[KvEvent, ...]:
        """Cache the full blocks of ``token_ids`` (the leased prefix and what followed) not yet cached.

        Only the blocks past the lease are hashed: the lease holds the chain up to there.
        """
        held = len(lease.pinned)
        parent = lease.pinned[-1] if lease.pinned else None
        return self._store(lease, token_ids, self.block_hashes(token_ids, start_block=held, parent=parent), held)

    def release(self, lease: Lease) -> None:
        """Unpin a lease's blocks; they stay cached until evicted, tail first."""
        for block_hash in reversed(lease.pinned):
            entry = self._blocks.get(block_hash)
            if entry is None:
                continue
            entry.refs -= 1
            if entry.refs == 0:
                self._unpinned[block_hash] = None  # most recent: a chain's root after its tail
        lease.pinned.clear()

    def clear(self) -> tuple[KvEvent, ...]:
        """Drop every block.

        Raises:
            CacheBusyError: some block is pinned by a running request.
        """
        if self.pinned_blocks:
            raise CacheBusyError(f"{self.pinned_blocks} blocks are held by running requests")
        self._blocks.clear()
        self._unpinned.clear()
        return (CacheCleared(),)

    def live_blocks(self) -> list[BlocksStored]:
        """Every cached block as its own store event, parents before children."""
        ordered = sorted(self._blocks.items(), key=lambda item: item[1].depth)
        return [
            BlocksStored((StoredBlock(block_hash, entry.token_ids),), entry.parent, self._block_size)
            for block_hash, entry in ordered
        ]

    def _match(self, token_ids: Sequence[int], hashes: Sequence[int]) -> int:
        limit = max(0, len(token_ids) - 1) // self._block_size
        matched = 0
        for block_hash in hashes[:limit]:
            if block_hash not in self._blocks:
                break
            matched += 1
        return matched

    def _pin(self, block_hash: int) -> None:
        entry = self._blocks[block_hash]
        if entry.refs == 0:
            self._unpinned.pop(block_hash, None)
        entry.refs += 1

    def _evict_one(self) -> int | None:
        """Drop the least recently used unpinned block; None when every block is pinned."""
        if not self._unpinned:
            return None
        block_hash, _ = self._unpinned.popitem(last=False)
        del self._blocks[block_hash]
        return block_hash

    def _store(self, lease: Lease, token_ids: Sequence[int], hashes: Sequence[int], first: int) -> tuple[KvEvent, ...]:
        """Pin (and cache if new) the blocks from position ``len(lease.pinned)`` on; ``hashes[0]`` is the hash
        of block ``first``."""
        removed: list[int] = []
        stored_runs: list[BlocksStored] = []
        run: list[StoredBlock] = []
        run_parent: int | None = None
        parent = lease.pinned[-1] if lease.pinned else None
        size = self._block_size
        for position in range(len(lease.pinned), first + len(hashes)):
            block_hash = hashes[position - first]
            if block_hash in self._blocks:
                # Already cached (another request stored it): the run of new blocks is broken here.
                if run:
                    stored_runs.append(BlocksStored(tuple(run), run_parent, size))
                    run = []
            else:
                if len(self._blocks) >= self._capacity:
                    victim = self._evict_one()
                    if victim is None:
                        break
                    removed.append(victim)
                tokens = tuple(token_ids[position * size : (position + 1) * size])
                self._blocks[block_hash] = _Entry(parent, tokens, position)
                if not run:
                    run_parent = parent
                run.append(StoredBlock(block_hash, tokens))
            self._pin(block_hash)
            lease.pinned.append(block_hash)
            parent = block_hash
        if run:
            stored_runs.append(BlocksStored(tuple(run), run_parent, size))
        events: list[KvEvent] = []
        if removed:
            events.append(BlocksRemoved(tuple(removed)))
        events.extend(stored_runs)
        return tuple(events)
