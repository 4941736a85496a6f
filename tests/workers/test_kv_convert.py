"""Protobuf KV events and load records -> the routing layer's values: only blocks a plain prompt can hit on
the worker's own device are kept."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from smg_grpc_proto.generated import common_pb2 as c
from smg_grpc_proto.generated import vllm_engine_pb2 as pb

from node.routing.kv_events import BlocksRemoved, BlocksStored, CacheCleared, KvEventBatch, SnapshotChunk, StoredBlock
from node.workers.kv_convert import (
    EngineLoad,
    batch_message,
    convert_batch,
    convert_event,
    convert_get_loads,
    convert_load_record,
)


def block(h: int, tokens: tuple[int, ...] = (1, 2, 3, 4), **kw: Any) -> Any:
    return c.KvBlock(block_hash=h, token_ids=tokens, **kw)


def stored(*blocks: Any, **kw: Any) -> Any:
    return c.KvCacheEvent(stored=c.KvBlocksStored(blocks=list(blocks), **kw))


def removed(*hashes: int, **kw: Any) -> Any:
    return c.KvCacheEvent(removed=c.KvBlocksRemoved(block_hashes=list(hashes), **kw))


def test_a_device_chain_becomes_blocks_stored() -> None:
    ev = stored(block(7, block_size=4), block(8, (5, 6, 7, 8)), parent_block_hash=-3, tier=c.KV_CACHE_TIER_DEVICE)
    assert convert_event(ev) == BlocksStored(
        blocks=(StoredBlock(7, (1, 2, 3, 4)), StoredBlock(8, (5, 6, 7, 8))), parent_block_hash=-3, block_size=4
    )


def test_an_unset_parent_is_the_root_and_a_missing_block_size_is_the_token_count() -> None:
    event = convert_event(stored(block(7, (1, 2, 3))))
    assert isinstance(event, BlocksStored)
    assert event.parent_block_hash is None and event.block_size == 3


@pytest.mark.parametrize(
    "kw",
    [
        {"locality": c.KV_CACHE_LOCALITY_REMOTE},
        {"tier": c.KV_CACHE_TIER_HOST},
        {"tier": c.KV_CACHE_TIER_DISK},
        {"tier": c.KV_CACHE_TIER_EXTERNAL},
        {"group_idx": 1},
        {"lora_name": "adapter"},
        {"cache_salt": "tenant-7"},
    ],
    ids=["remote", "host", "disk", "external", "group1", "lora", "salt"],
)
def test_stores_no_plain_prompt_can_hit_are_dropped(kw: dict[str, Any]) -> None:
    assert convert_event(stored(block(7), **kw)) is None


def test_local_and_unspecified_placement_are_kept() -> None:
    for kw in ({"locality": c.KV_CACHE_LOCALITY_LOCAL}, {"tier": c.KV_CACHE_TIER_UNSPECIFIED}, {"group_idx": 0}):
        assert isinstance(convert_event(stored(block(7), **kw)), BlocksStored), kw


@pytest.mark.parametrize(
    "bad",
    [
        {"lora_id": 3},
        {"cache_level": 1},
        {"extra_keys": [c.KvBlockExtraKey(text="image-hash")]},
    ],
    ids=["lora_id", "cache_level", "extra_keys"],
)
def test_a_chain_with_one_keyed_or_offloaded_block_is_dropped_whole(bad: dict[str, Any]) -> None:
    assert convert_event(stored(block(7), block(8, **bad))) is None


def test_an_empty_store_is_nothing() -> None:
    assert convert_event(stored()) is None


def test_removals_follow_the_same_placement_rules() -> None:
    assert convert_event(removed(7, 8)) == BlocksRemoved((7, 8))
    assert convert_event(removed(7, locality=c.KV_CACHE_LOCALITY_REMOTE)) is None
    assert convert_event(removed(7, tier=c.KV_CACHE_TIER_HOST)) is None
    assert convert_event(removed(7, group_idx=2)) is None
    assert convert_event(removed(7, cache_level=1)) is None
    assert convert_event(c.KvCacheEvent(cleared=c.KvCacheCleared())) == CacheCleared()
    assert convert_event(c.KvCacheEvent(event_id=1)) is None  # no data: a newer kind we do not know


def test_a_batch_keeps_its_sequence_and_snapshot_and_drops_what_it_cannot_use() -> None:
    batch = c.KvEventBatch(
        sequence_number=42,
        events=[c.KvCacheEvent(cleared=c.KvCacheCleared()), stored(block(7), lora_name="x"), removed(9)],
        snapshot=c.KvSnapshotChunk(index=0, count=3, blocks=120, unknown_before=5),
    )
    got = convert_batch(batch)
    assert got.sequence_number == 42
    assert got.events == (CacheCleared(), BlocksRemoved((9,)))
    assert got.snapshot == SnapshotChunk(0, 3, 120, 5)
    assert convert_batch(c.KvEventBatch(sequence_number=43)).snapshot is None


def test_a_load_record_converts_with_its_age() -> None:
    record = c.EngineLoad(running_requests=3, waiting_requests=2, token_usage=0.25, gen_throughput=900.0, age_ms=1500)
    assert convert_load_record(record) == EngineLoad(
        running=3, waiting=2, waiting_uncached_tokens=None, token_usage=0.25, gen_throughput=900.0, age_s=1.5
    )
    record.waiting_uncached_tokens = 0  # set, even to 0, means the engine can tell
    assert convert_load_record(record).waiting_uncached_tokens == 0


def test_get_loads_sums_the_ranks_and_averages_the_usage() -> None:
    resp = pb.GetLoadsResponse(
        loads=[
            pb.SchedulerLoad(
                num_running_reqs=2,
                num_waiting_reqs=1,
                num_waiting_uncached_tokens=100,
                token_usage=0.2,
                gen_throughput=500.0,
            ),
            pb.SchedulerLoad(
                num_running_reqs=4,
                num_waiting_reqs=0,
                num_waiting_uncached_tokens=50,
                token_usage=0.6,
                gen_throughput=700.0,
            ),
        ]
    )
    load = convert_get_loads(resp)
    assert (load.running, load.waiting, load.waiting_uncached_tokens) == (6, 1, 150)
    assert load.token_usage == pytest.approx(0.4) and load.gen_throughput == 1200.0
    assert convert_get_loads(pb.GetLoadsResponse()) == EngineLoad(0, 0, 0, 0.0, 0.0)


_i64 = st.integers(-(2**63), 2**63 - 1)
_stored = st.builds(
    BlocksStored,
    blocks=st.lists(
        st.builds(StoredBlock, _i64, st.tuples(*[st.integers(0, 2**32 - 1)] * 4)), min_size=1, max_size=4
    ).map(tuple),
    parent_block_hash=st.none() | _i64,
    block_size=st.just(4),
)
_event = _stored | st.builds(BlocksRemoved, st.lists(_i64, max_size=4).map(tuple)) | st.just(CacheCleared())
_snapshot = st.none() | st.builds(
    SnapshotChunk, st.integers(0, 99), st.integers(1, 100), st.integers(0, 10**6), st.integers(0, 10**6)
)


@given(
    sequence=st.integers(1, 2**62),
    events=st.lists(st.tuples(st.integers(0, 2**62), _event), max_size=6),
    snapshot=_snapshot,
)
def test_what_the_simulated_engine_writes_the_gateway_reads_back_unchanged(
    sequence: int,
    events: list[tuple[int, BlocksStored | BlocksRemoved | CacheCleared]],
    snapshot: SnapshotChunk | None,
) -> None:
    """One module holds both directions of the KV-event wire: batch_message (node/sim) and convert_batch."""
    wire = c.KvEventBatch.FromString(batch_message(sequence, 1.5, events, snapshot).SerializeToString())
    assert convert_batch(wire) == KvEventBatch(sequence, tuple(event for _, event in events), snapshot)
    assert [e.event_id for e in wire.events] == [event_id for event_id, _ in events]
