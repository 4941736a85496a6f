"""KV-cache events as the routing index takes them: typed, immutable, free of protobuf.

The gRPC subscriber converts each ``smg.grpc.common.KvEventBatch`` (SubscribeKvEvents, common.proto):

- ``KvEventBatch.sequence_number`` -> ``KvEventBatch.sequence_number``; ``events`` in order; ``snapshot``
  (when set) -> ``SnapshotChunk(index, count, blocks, unknown_before)``. ``timestamp`` and ``event_id`` are
  not needed. ``load`` goes to the pool's ``LoadView``, not here. A ``load_only`` batch (no events) may be
  passed or dropped: the index ignores sequence 0 and repeats of the last sequence.
- ``KvCacheEvent.stored`` -> ``BlocksStored``: ``blocks`` -> ``StoredBlock(block_hash, tuple(token_ids))``
  in order (a chain: each block's parent is the one before it); ``parent_block_hash`` -> the same, or None
  when the field is unset (the chain starts at the root); ``block_size`` -> the first block's
  ``block_size`` (or its token count when 0).
- ``KvCacheEvent.removed`` -> ``BlocksRemoved(tuple(block_hashes))``; ``cleared`` -> ``CacheCleared()``.
- Skip (do not convert) stored/removed events that a plain prompt can never hit: ``locality`` REMOTE, a
  ``tier`` other than UNSPECIFIED/DEVICE (or ``cache_level`` > 0), ``group_idx`` > 0 (hybrid models'
  non-full-attention groups), a ``lora_name``/``cache_salt``, or blocks with ``lora_id``/``extra_keys``.
  Such blocks would otherwise be matched as if any prompt with the same tokens could reuse them.
- ``dp_rank``: one index worker per worker URL assumes one rank per worker (or ranks sharing one stream).

The engine's ``block_hash`` is used only to resolve parents and removals; matching uses our own hash of
``token_ids`` (``block_hashes``), so it does not depend on how the engine hashes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StoredBlock:
    block_hash: int
    token_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class BlocksStored:
    """Full blocks newly cached, one chain under ``parent_block_hash`` (None: a chain from the root)."""

    blocks: tuple[StoredBlock, ...]
    parent_block_hash: int | None
    block_size: int


@dataclass(frozen=True, slots=True)
class BlocksRemoved:
    block_hashes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class CacheCleared:
    pass


KvEvent = BlocksStored | BlocksRemoved | CacheCleared


@dataclass(frozen=True, slots=True)
class SnapshotChunk:
    """One chunk of a relay's state snapshot; chunk 0 begins with ``CacheCleared``."""

    index: int
    count: int
    blocks: int
    unknown_before: int = 0  # publisher batches the relay never saw: the snapshot may lack their blocks


@dataclass(frozen=True, slots=True)
class KvEventBatch:
    sequence_number: int
    events: tuple[KvEvent, ...]
    snapshot: SnapshotChunk | None = None
