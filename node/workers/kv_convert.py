"""Protobuf KvEventBatch / load records <-> the routing layer's typed values (see node/routing/kv_events.py).

Both directions of the KV-event wire live here: the gateway's subscriber reads batches with
``convert_batch``, the simulated engine (node/sim) writes them with ``batch_message``, so the two cannot drift
apart (a round-trip test holds them together). Pure functions over the untyped protobuf messages; ``Any``
stops here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from smg_grpc_proto.generated import common_pb2

from node.routing.kv_events import (
    BlocksRemoved,
    BlocksStored,
    CacheCleared,
    KvEvent,
    KvEventBatch,
    SnapshotChunk,
    StoredBlock,
)

# common.proto enum values (KvCacheTier, KvCacheLocality): only device-local blocks feed a prefix index.
_TIER_OK = frozenset({0, 1})  # UNSPECIFIED, DEVICE
_LOCALITY_REMOTE = 2


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """An engine's load as a worker reports it (GetLoads or a KV batch's load record), summed over ranks."""

    running: int
    waiting: int
    waiting_uncached_tokens: int | None
    token_usage: float
    gen_throughput: float
    age_s: float = 0.0


def _plain_device(ev: Any) -> bool:
    """Blocks (stored or removed) any plain prompt could hit: local, on the device, full attention."""
    if ev.HasField("locality") and ev.locality == _LOCALITY_REMOTE:
        return False
    if ev.HasField("tier") and ev.tier not in _TIER_OK:
        return False
    return not (ev.HasField("group_idx") and ev.group_idx > 0)


def convert_event(ev: Any) -> KvEvent | None:
    kind = ev.WhichOneof("data")
    if kind == "stored":
        s = ev.stored
        # Only stores name a LoRA adapter or a cache salt (KvBlocksRemoved has neither field).
        if (
            not _plain_device(s)
            or s.HasField("lora_name")
            or s.HasField("cache_salt")
            or any(
                b.HasField("lora_id") or len(b.extra_keys) or (b.HasField("cache_level") and b.cache_level > 0)
                for b in s.blocks
            )
        ):
            return None
        if not s.blocks:
            return None
        first = s.blocks[0]
        return BlocksStored(
            blocks=tuple(StoredBlock(b.block_hash, tuple(b.token_ids)) for b in s.blocks),
            parent_block_hash=s.parent_block_hash if s.HasField("parent_block_hash") else None,
            block_size=first.block_size or len(first.token_ids),
        )
    if kind == "removed":
        r = ev.removed
        if not _plain_device(r) or (r.HasField("cache_level") and r.cache_level > 0):
            return None
        return BlocksRemoved(tuple(r.block_hashes))
    if kind == "cleared":
        return CacheCleared()
    return None


def convert_batch(batch: Any) -> KvEventBatch:
    events = tuple(e for e in (convert_event(ev) for ev in batch.events) if e is not None)
    snapshot = None
    if batch.HasField("snapshot"):
        sn = batch.snapshot
        snapshot = SnapshotChunk(sn.index, sn.count, sn.blocks, sn.unknown_before)
    return KvEventBatch(sequence_number=batch.sequence_number, events=events, snapshot=snapshot)


def convert_load_record(load: Any) -> EngineLoad:
    return EngineLoad(
        running=load.running_requests,
        waiting=load.waiting_requests,
        waiting_uncached_tokens=load.waiting_uncached_tokens if load.HasField("waiting_uncached_tokens") else None,
        token_usage=load.token_usage,
        gen_throughput=load.gen_throughput,
        age_s=load.age_ms / 1000.0,
    )


def convert_get_loads(resp: Any) -> EngineLoad:
    loads = list(resp.loads)
    n = max(1, len(loads))
    return EngineLoad(
        running=sum(x.num_running_reqs for x in loads),
        waiting=sum(x.num_waiting_reqs for x in loads),
        waiting_uncached_tokens=sum(x.num_waiting_uncached_tokens for x in loads),
        token_usage=sum(x.token_usage for x in loads) / n,
        gen_throughput=sum(x.gen_throughput for x in loads),
    )


def event_message(event_id: int, event: KvEvent) -> Any:
    """The ``KvCacheEvent`` of a typed event: device-local, full attention, no LoRA (what convert_event keeps)."""
    if isinstance(event, BlocksStored):
        stored = common_pb2.KvBlocksStored(
            blocks=[
                common_pb2.KvBlock(block_hash=b.block_hash, token_ids=b.token_ids, block_size=event.block_size)
                for b in event.blocks
            ]
        )
        if event.parent_block_hash is not None:
            stored.parent_block_hash = event.parent_block_hash
        return common_pb2.KvCacheEvent(event_id=event_id, stored=stored)
    if isinstance(event, BlocksRemoved):
        return common_pb2.KvCacheEvent(
            event_id=event_id, removed=common_pb2.KvBlocksRemoved(block_hashes=event.block_hashes)
        )
    return common_pb2.KvCacheEvent(event_id=event_id, cleared=common_pb2.KvCacheCleared())


def batch_message(
    sequence_number: int,
    timestamp: float,
    events: Iterable[tuple[int, KvEvent]],
    snapshot: SnapshotChunk | None = None,
) -> Any:
    """The ``KvEventBatch`` of numbered typed events (``(event_id, event)``), with its snapshot chunk."""
    message = common_pb2.KvEventBatch(sequence_number=sequence_number, timestamp=timestamp)
    message.events.extend(event_message(event_id, event) for event_id, event in events)
    if snapshot is not None:
        message.snapshot.CopyFrom(
            common_pb2.KvSnapshotChunk(
                index=snapshot.index,
                count=snapshot.count,
                blocks=snapshot.blocks,
                unknown_before=snapshot.unknown_before,
            )
        )
    return message
