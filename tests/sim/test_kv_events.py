"""The KV event log: numbering, bounded history, replay on resume, snapshots for lost cursors."""

from __future__ import annotations

from node.routing.kv_events import BlocksRemoved, BlocksStored, CacheCleared, StoredBlock
from node.sim.kv_events import MAX_SNAPSHOT_CHUNKS, KvEventLog

LIVE = [
    BlocksStored((StoredBlock(11, (1, 2)),), None, 2),
    BlocksStored((StoredBlock(12, (3, 4)),), 11, 2),
]


def removed(*hashes: int) -> BlocksRemoved:
    return BlocksRemoved(tuple(hashes))


def test_batches_number_from_one_and_event_ids_are_monotonic() -> None:
    log = KvEventLog()
    assert log.last_sequence == 0
    assert log.append([], 1.0) is None  # no events, no number used
    first = log.append([removed(1), removed(2)], 1.0)
    second = log.append([CacheCleared()], 2.0)
    assert first is not None and second is not None
    assert (first.sequence_number, second.sequence_number) == (1, 2)
    assert [e.event_id for e in (*first.events, *second.events)] == [1, 2, 3]
    assert second.timestamp == 2.0
    assert log.last_sequence == 2


def test_history_is_bounded_and_read_after_reports_a_lost_cursor() -> None:
    log = KvEventLog(history_batches=3)
    for i in range(5):
        log.append([removed(i)], float(i))
    assert log.oldest_sequence == 3
    assert [b.sequence_number for b in log.read_after(2) or []] == [3, 4, 5]
    assert log.read_after(5) == []
    assert log.read_after(1) is None


def test_fresh_subscriber_gets_the_whole_history_while_it_reaches_batch_one() -> None:
    log = KvEventLog(history_batches=10)
    assert log.resume(0, LIVE, 0.0) == []
    log.append([removed(1)], 0.0)
    log.append([removed(2)], 0.0)
    assert [b.sequence_number for b in log.resume(0, LIVE, 0.0)] == [1, 2]


def test_fresh_subscriber_after_history_dropped_gets_a_snapshot_at_the_current_sequence() -> None:
    log = KvEventLog(history_batches=2)
    for i in range(4):
        log.append([removed(i)], 0.0)
    (snapshot,) = log.resume(0, LIVE, 9.0)
    assert snapshot.sequence_number == 4
    assert snapshot.snapshot is not None
    assert (snapshot.snapshot.index, snapshot.snapshot.count, snapshot.snapshot.blocks) == (0, 1, 2)
    assert [e.event for e in snapshot.events] == [CacheCleared(), *LIVE]
    assert all(e.event_id == 0 for e in snapshot.events)


def test_returning_subscriber_is_replayed_what_it_missed() -> None:
    log = KvEventLog(history_batches=10)
    for i in range(6):
        log.append([removed(i)], 0.0)
    assert [b.sequence_number for b in log.resume(4, LIVE, 0.0)] == [5, 6]
    assert log.resume(6, LIVE, 0.0) == []


def test_lost_cursor_gets_snapshot_chunks_that_continue_its_sequence() -> None:
    log = KvEventLog(history_batches=2)
    for i in range(10):
        log.append([removed(i)], 0.0)
    chunks = log.resume(5, LIVE, 0.0)
    assert [c.sequence_number for c in chunks] == [6, 7, 8, 9, 10]
    assert [c.snapshot.index for c in chunks if c.snapshot] == [0, 1, 2, 3, 4]
    assert all(c.snapshot and c.snapshot.count == 5 for c in chunks)
    assert [e.event for e in chunks[0].events] == [CacheCleared(), *LIVE]
    assert all(not c.events for c in chunks[1:])


def test_cursor_from_a_previous_engine_life_gets_a_snapshot() -> None:
    log = KvEventLog()
    log.append([removed(1)], 0.0)
    (snapshot,) = log.resume(50, LIVE, 0.0)
    assert snapshot.sequence_number == 1
    assert snapshot.snapshot is not None


def test_snapshot_chunks_are_bounded() -> None:
    log = KvEventLog(history_batches=1)
    log._last_sequence = MAX_SNAPSHOT_CHUNKS + 100  # a subscriber gone for a very long time
    log.append([removed(1)], 0.0)
    chunks = log.resume(1, [], 0.0)
    assert len(chunks) == MAX_SNAPSHOT_CHUNKS
    assert chunks[-1].sequence_number == log.last_sequence
