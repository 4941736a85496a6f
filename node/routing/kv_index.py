"""The KV-event index of one model: which worker holds which prompt prefix, from the engines' own events.

Pure: batches in (``apply``), answers out (``match``); a gap in a worker's sequence is reported for the
caller to resubscribe, never handled with I/O here.

Layout. ``_index`` maps a prefix hash (``block_hashes``: position-salted, rolling over token blocks) to the
bitmask of workers holding that prefix. Each worker keeps its engine's ``block_hash`` -> (position, prefix
hash), needed to place a stored chain under its parent and to undo a removal; its dict order is insertion
order, which is what the memory bound evicts by. Physical copies of one engine block (device and host tiers)
and several engine blocks with one prefix (hashing under extra keys) are counted in small side tables, so
a worker's bit goes only when its last copy does.

Sequence. Each worker's cursor is the last batch applied (0: none yet, and then any batch is accepted,
since a fresh subscription starts with the history or a snapshot). Repeats are ignored; a batch beyond
``cursor + 1`` is not applied and ``Resubscribe(from_sequence=cursor)`` returned: subscribing again with
that ``start_sequence_number`` replays what was missed, or sends a snapshot whose chunks continue the
sequence and begin with CacheCleared.

Block size is learned from the first store; stores at another size are not indexed (counted as orphans),
as are stores under a parent the index never saw (it was evicted, or stored before the subscription).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import islice

from node.routing.block_hashes import BlockHashes, block_hash, leading_depths
from node.routing.kv_events import BlocksRemoved, BlocksStored, CacheCleared, KvEventBatch

# Beyond the bound, this fraction of it is evicted at once: popping a dict's oldest entries one at a time is
# quadratic (each pop rescans the deleted slots before it), a batch scans them once.
EVICTION_BATCH_DIVISOR = 64
# Measured with tracemalloc (bench/routing_bench.py): a worker's block entry (engine hash -> packed position
# and prefix) and one prefix entry of the shared index. The estimate, not the truth: small side tables and
# dict growth slack are left out.
BYTES_PER_BLOCK = 110
BYTES_PER_PREFIX = 100

_MASK64 = (1 << 64) - 1
_SIGN64 = 1 << 63


def _pack(position: int, prefix: int) -> int:
    return (position << 64) | (prefix & _MASK64)


def _unpack(packed: int) -> tuple[int, int]:
    prefix = packed & _MASK64
    return packed >> 64, prefix - (1 << 64) if prefix & _SIGN64 else prefix


@dataclass(frozen=True, slots=True)
class Resubscribe:
    """Batches were skipped: subscribe again with ``start_sequence_number=from_sequence``."""

    worker_url: str
    from_sequence: int
    expected: int
    received: int


@dataclass(frozen=True, slots=True)
class KvIndexStats:
    workers: int
    blocks: int  # block copies indexed, all workers together
    prefixes: int  # distinct prefixes held by any worker
    bytes_estimate: int
    block_size: int | None
    evicted_blocks: int
    orphan_blocks: int
    unknown_removals: int
    duplicate_batches: int
    gaps: int


class _Worker:
    __slots__ = ("bit", "blocks", "copies", "count", "cursor", "lagging", "partial", "shared")

    def __init__(self, bit: int) -> None:
        self.bit = bit
        self.count = 0  # block copies held
        self.cursor = 0
        self.lagging = False  # a gap was seen and no batch applied since
        self.partial = False  # the last snapshot said the relay missed part of the engine's history
        self.blocks: dict[int, int] = {}  # engine block hash -> _pack(position, prefix hash)
        self.copies: dict[int, int] = {}  # engine block hash -> extra physical copies
        self.shared: dict[int, int] = {}  # prefix hash -> extra engine blocks of this worker with it


class KvIndex:
    def __init__(self, max_blocks: int) -> None:
        if max_blocks < 1:
            raise ValueError("max_blocks must be >= 1")
        self._max_blocks = max_blocks
        self._index: dict[int, int] = {}
        self._workers: dict[str, _Worker] = {}
        self._urls_by_bit: dict[int, str] = {}
        self._block_size: int | None = None
        self._blocks = 0
        self._evicted = 0
        self._orphans = 0
        self._unknown_removals = 0
        self._duplicates = 0
        self._gaps = 0

    @property
    def block_size(self) -> int | None:
        return self._block_size

    # -- events ---------------------------------------------------------------------------------------------

    def apply(self, worker_url: str, batch: KvEventBatch) -> Resubscribe | None:
        """Apply ``batch`` from ``worker_url``'s stream; a Resubscribe when batches before it were missed."""
        sequence = batch.sequence_number
        if sequence == 0:
            # A load-only record before the publisher's first batch: it says nothing of the cache (an engine
            # without KV events sends only these), so it does not make the worker known.
            return None
        worker = self._workers.get(worker_url) or self._add_worker(worker_url)
        if worker.cursor and sequence <= worker.cursor:
            self._duplicates += 1
            return None
        if worker.cursor and sequence != worker.cursor + 1:
            self._gaps += 1
            worker.lagging = True
            return Resubscribe(worker_url, worker.cursor, worker.cursor + 1, sequence)
        if batch.snapshot is not None and batch.snapshot.index == 0:
            worker.partial = batch.snapshot.unknown_before > 0
        for event in batch.events:
            if isinstance(event, BlocksStored):
                self._stored(worker, event)
            elif isinstance(event, BlocksRemoved):
                for engine_hash in event.block_hashes:
                    self._remove(worker, engine_hash)
            elif isinstance(event, CacheCleared):
                self._clear(worker)
        worker.cursor = sequence
        worker.lagging = False
        if self._blocks > self._max_blocks:
            self._evict()
        return None

    def forget_worker(self, worker_url: str) -> None:
        """Drop everything known of ``worker_url`` (it left, or will be resubscribed from sequence 0)."""
        worker = self._workers.pop(worker_url, None)
        if worker is not None:
            self._clear(worker)
            del self._urls_by_bit[worker.bit.bit_length() - 1]

    def resume_from(self, worker_url: str) -> int:
        """The ``start_sequence_number`` to subscribe ``worker_url`` with: its last applied batch, or 0."""
        worker = self._workers.get(worker_url)
        return worker.cursor if worker is not None else 0

    # -- queries --------------------------------------------------------------------------------------------

    def knows(self, worker_url: str) -> bool:
        """Whether ``worker_url`` publishes events (the index has taken at least one of its batches)."""
        return worker_url in self._workers

    def lagging(self, worker_url: str) -> bool:
        """Whether a gap was seen on ``worker_url``'s stream and no batch applied since (data may be stale)."""
        worker = self._workers.get(worker_url)
        return worker is not None and worker.lagging

    def partially_known(self, worker_url: str) -> bool:
        """Whether ``worker_url``'s last snapshot said the relay missed some of the engine's history."""
        worker = self._workers.get(worker_url)
        return worker is not None and worker.partial

    def blocks_of(self, worker_url: str) -> int:
        worker = self._workers.get(worker_url)
        return 0 if worker is None else worker.count

    def holdings(self, worker_urls: Sequence[str]) -> list[int | None]:
        """Block copies each worker holds, None for a worker that publishes no events (one call for a pool)."""
        workers = self._workers
        return [None if (w := workers.get(url)) is None else w.count for url in worker_urls]

    def match(self, prompt: Sequence[int] | BlockHashes) -> dict[str, int]:
        """Leading full blocks of ``prompt`` each worker holds (workers holding none are omitted)."""
        size = self._block_size
        if size is None or not self._index:
            return {}
        hashes = prompt.resized(size) if isinstance(prompt, BlockHashes) else BlockHashes(prompt, size)
        depths = leading_depths(hashes, self._index.get)
        return {self._urls_by_bit[bit]: depth for bit, depth in depths.items()}

    def stats(self) -> KvIndexStats:
        return KvIndexStats(
            workers=len(self._workers),
            blocks=self._blocks,
            prefixes=len(self._index),
            bytes_estimate=self._blocks * BYTES_PER_BLOCK + len(self._index) * BYTES_PER_PREFIX,
            block_size=self._block_size,
            evicted_blocks=self._evicted,
            orphan_blocks=self._orphans,
            unknown_removals=self._unknown_removals,
            duplicate_batches=self._duplicates,
            gaps=self._gaps,
        )

    # -- internals ------------------------------------------------------------------------------------------

    def _add_worker(self, url: str) -> _Worker:
        bit = next(i for i in range(len(self._urls_by_bit) + 1) if i not in self._urls_by_bit)
        self._urls_by_bit[bit] = url
        worker = self._workers[url] = _Worker(1 << bit)
        return worker

    def _stored(self, worker: _Worker, event: BlocksStored) -> None:
        size = event.block_size
        if self._block_size is None and size > 0:
            self._block_size = size
        if size != self._block_size:
            self._orphans += len(event.blocks)
            return
        if event.parent_block_hash is None:
            position, prefix = 0, 0
        else:
            parent = worker.blocks.get(event.parent_block_hash)
            if parent is None:
                self._orphans += len(event.blocks)
                return
            position, prefix = _unpack(parent)
            position += 1
        for i, block in enumerate(event.blocks):
            if len(block.token_ids) != size:
                self._orphans += len(event.blocks) - i  # a partial block ends what can be matched
                return
            prefix ^= block_hash(position, block.token_ids)
            self._store(worker, block.block_hash, position, prefix)
            position += 1

    def _store(self, worker: _Worker, engine_hash: int, position: int, prefix: int) -> None:
        self._blocks += 1
        worker.count += 1
        if engine_hash in worker.blocks:
            worker.copies[engine_hash] = worker.copies.get(engine_hash, 0) + 1
            return
        worker.blocks[engine_hash] = _pack(position, prefix)
        mask = self._index.get(prefix, 0)
        if mask & worker.bit:
            worker.shared[prefix] = worker.shared.get(prefix, 0) + 1
        else:
            self._index[prefix] = mask | worker.bit

    def _remove(self, worker: _Worker, engine_hash: int) -> None:
        copies = worker.copies.get(engine_hash)
        if copies:
            self._blocks -= 1
            worker.count -= 1
            if copies == 1:
                del worker.copies[engine_hash]
            else:
                worker.copies[engine_hash] = copies - 1
            return
        packed = worker.blocks.pop(engine_hash, None)
        if packed is None:
            self._unknown_removals += 1
            return
        self._blocks -= 1
        worker.count -= 1
        _, prefix = _unpack(packed)
        shared = worker.shared.get(prefix)
        if shared:
            if shared == 1:
                del worker.shared[prefix]
            else:
                worker.shared[prefix] = shared - 1
            return
        mask = self._index[prefix] & ~worker.bit
        if mask:
            self._index[prefix] = mask
        else:
            del self._index[prefix]

    def _clear(self, worker: _Worker) -> None:
        index, keep = self._index, ~worker.bit
        for packed in worker.blocks.values():
            _, prefix = _unpack(packed)
            mask = index.get(prefix, 0) & keep
            if mask:
                index[prefix] = mask
            else:
                index.pop(prefix, None)
        self._blocks -= worker.count
        worker.count = 0
        worker.blocks = {}
        worker.copies = {}
        worker.shared = {}

    def _evict(self) -> None:
        batch = max(1, self._max_blocks // EVICTION_BATCH_DIVISOR)
        while self._blocks > self._max_blocks:
            largest = max(self._workers.values(), key=lambda w: len(w.blocks))
            for engine_hash in list(islice(largest.blocks, batch)):
                extra = largest.copies.pop(engine_hash, 0)
                self._blocks -= extra
                largest.count -= extra
                self._evicted += extra + 1
                self._remove(largest, engine_hash)
