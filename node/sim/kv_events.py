"""KV cache events and their numbered, bounded log: what SubscribeKvEvents streams.

Pure: batches get consecutive sequence numbers from 1 (0 means "no cursor" to a subscriber), events get
monotonic ids, and the log keeps the last ``KV_EVENT_HISTORY_BATCHES`` batches so a subscriber that
reconnects with its last sequence number is replayed exactly what it missed. A subscriber whose cursor the
history no longer reaches gets a snapshot instead: a KvCacheCleared and one store per live block, spread over
snapshot chunks numbered so that they continue the subscriber's own sequence and end at the current one
(the shape of ``KvSnapshotChunk`` in common.proto), then live batches with no gap.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import islice

# The typed events are the gateway's own (what its subscriber converts the wire into), so what the engine
# publishes and what the router reads are one type; node/workers/kv_convert.py converts both ways.
from node.routing.kv_events import BlocksStored, CacheCleared, KvEvent, SnapshotChunk

# Batches kept for replay. At one batch per admission and one per completion this covers a reconnect of a
# few seconds under heavy load; a subscriber gone longer is resynchronised with a snapshot.
KV_EVENT_HISTORY_BATCHES = 4096
# Snapshot chunks sent to one subscriber: beyond this the snapshot starts later than the subscriber's cursor
# (it sees a gap) rather than streaming millions of empty chunks.
MAX_SNAPSHOT_CHUNKS = 65536


@dataclass(frozen=True, slots=True)
class NumberedEvent:
    event_id: int
    """Monotonic over the engine's life; 0 for events synthesised for a snapshot."""
    event: KvEvent


@dataclass(frozen=True, slots=True)
class KvBatch:
    sequence_number: int
    timestamp: float
    events: tuple[NumberedEvent, ...]
    snapshot: SnapshotChunk | None = None


class KvEventLog:
    def __init__(self, history_batches: int = KV_EVENT_HISTORY_BATCHES) -> None:
        if history_batches < 1:
            raise ValueError("history_batches must be >= 1")
        self._history: deque[KvBatch] = deque(maxlen=history_batches)
        self._last_sequence = 0
        self._last_event_id = 0

    @property
    def last_sequence(self) -> int:
        """The number of the newest batch; 0 before the first."""
        return self._last_sequence

    @property
    def oldest_sequence(self) -> int:
        """The number of the oldest batch still held (``last_sequence + 1`` when none is)."""
        return self._history[0].sequence_number if self._history else self._last_sequence + 1

    def append(self, events: Sequence[KvEvent], timestamp: float) -> KvBatch | None:
        """Number ``events`` as the next batch; None (and no number used) when there are none."""
        if not events:
            return None
        numbered = []
        for event in events:
            self._last_event_id += 1
            numbered.append(NumberedEvent(self._last_event_id, event))
        self._last_sequence += 1
        batch = KvBatch(self._last_sequence, timestamp, tuple(numbered))
        self._history.append(batch)
        return batch

    def read_after(self, cursor: int) -> list[KvBatch] | None:
        """The batches numbered above ``cursor``; None when the history no longer reaches ``cursor + 1``."""
        if cursor >= self._last_sequence:
            return []
        oldest = self.oldest_sequence
        if cursor + 1 < oldest:
            return None
        return list(islice(self._history, cursor + 1 - oldest, None))

    def resume(self, cursor: int, live_blocks: Sequence[BlocksStored], timestamp: float) -> list[KvBatch]:
        """What a subscriber whose last applied batch is ``cursor`` (0: none) gets before live batches.

        Afterwards the subscriber is at ``last_sequence``. A fresh subscriber gets the whole history when it
        reaches back to batch 1, else a snapshot of ``live_blocks`` (parents before children); a returning
        one gets the batches it missed, else a snapshot numbered to continue its sequence. A cursor beyond
        ``last_sequence`` (from an earlier life of the engine) gets a snapshot numbered ``last_sequence``,
        which such a subscriber may drop as stale: nothing numbered on this side can fix its cursor.
        """
        if cursor == 0:
            if self.oldest_sequence <= 1:
                return list(self._history)
            return self._snapshot(self._last_sequence, 1, live_blocks, timestamp)
        if cursor <= self._last_sequence:
            missed = self.read_after(cursor)
            if missed is not None:
                return missed
        if self._last_sequence == 0:
            return []
        # Chunks numbered cursor+1 .. last: no gap for the subscriber, and live batches follow on.
        count = min(max(1, self._last_sequence - cursor), MAX_SNAPSHOT_CHUNKS)
        return self._snapshot(self._last_sequence, count, live_blocks, timestamp)

    @staticmethod
    def _snapshot(last: int, count: int, live_blocks: Sequence[BlocksStored], timestamp: float) -> list[KvBatch]:
        blocks = sum(len(stored.blocks) for stored in live_blocks)
        first_events = (
            NumberedEvent(0, CacheCleared()),
            *(NumberedEvent(0, stored) for stored in live_blocks),
        )
        return [
            KvBatch(
                sequence_number=last - count + 1 + i,
                timestamp=timestamp,
                events=first_events if i == 0 else (),
                snapshot=SnapshotChunk(index=i, count=count, blocks=blocks),
            )
            for i in range(count)
        ]
