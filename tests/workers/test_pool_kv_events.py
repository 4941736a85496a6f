"""The pool's KV-event subscriber: a sequence gap makes it resubscribe from the last sequence it applied."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence

from node.config import WorkerPoolConfig
from node.routing.kv_events import BlocksStored, KvEventBatch, StoredBlock
from node.routing.kv_indexes import KvIndexes
from node.routing.round_robin import RoundRobin
from node.tasks import Supervisor
from node.workers.breaker import CircuitBreaker
from node.workers.kv_convert import EngineLoad
from node.workers.pool import WorkerPool
from node.workers.types import ModelInfo, WorkerOutput, WorkerRequest

URL = "grpc://127.0.0.1:1"


def batch(sequence: int) -> KvEventBatch:
    """One stored block per batch, each chained under the previous one."""
    parent = sequence - 1 if sequence > 1 else None
    stored = BlocksStored((StoredBlock(sequence, (sequence,) * 4),), parent_block_hash=parent, block_size=4)
    return KvEventBatch(sequence_number=sequence, events=(stored,))


class Publisher:
    """Answers each subscription with the next of ``streams``, then stays subscribed (a live stream ends only
    when the subscriber leaves); records each start_sequence_number."""

    def __init__(self, streams: list[list[int]]) -> None:
        self.streams = streams
        self.starts: list[int] = []
        self.done = asyncio.Event()

    @property
    def url(self) -> str:
        return URL

    async def kv_events(
        self, start_sequence_number: int
    ) -> AsyncGenerator[tuple[KvEventBatch | None, EngineLoad | None], None]:
        self.starts.append(start_sequence_number)
        for sequence in self.streams.pop(0) if self.streams else ():
            yield batch(sequence), None
        if not self.streams:
            self.done.set()
        await asyncio.Event().wait()

    async def health(self, *, timeout_s: float) -> bool:
        return True

    async def model_info(self, *, timeout_s: float) -> ModelInfo:
        return ModelInfo(served_model_name="m", model_path="/m", max_context_length=1024, vocab_size=100)

    async def loads(self, *, timeout_s: float) -> EngineLoad | None:
        return None

    def generate(self, request: WorkerRequest) -> AsyncGenerator[WorkerOutput, None]:
        raise NotImplementedError

    async def abort(self, request_ids: Sequence[str], *, timeout_s: float) -> None:
        return None

    async def connection_lost(self) -> None:
        await asyncio.Event().wait()  # the test says when the worker is gone

    async def close(self) -> None:
        return None


async def test_a_sequence_gap_resubscribes_from_the_last_applied_sequence() -> None:
    # The first stream skips batch 3 (and stays open); the second, the replay from 2, carries 3 to 6.
    publisher = Publisher([[1, 2, 4, 5], [3, 4, 5, 6]])
    indexes = KvIndexes(1000)
    loop = asyncio.get_running_loop()
    async with Supervisor() as supervisor:
        pool = WorkerPool(
            WorkerPoolConfig(workers=(URL,), health_interval_s=0.05),
            client_factory=lambda _url: publisher,
            policies=lambda _role, _model: RoundRobin(),
            policy_name="round_robin",
            breakers=lambda: CircuitBreaker(failures_to_open=1, open_s=1.0, clock=loop.time),
            supervisor=supervisor,
            kv_indexes=indexes,
        )
        pool.start()
        await asyncio.wait_for(publisher.done.wait(), 5.0)
        index = indexes.of(None)
        # 0: a fresh subscription; 2: at once after the gap (4 arrived after 2), not when the stream ends.
        assert publisher.starts == [0, 2]
        stats = index.stats()
        assert stats.gaps == 1 and stats.blocks == 6 and stats.orphan_blocks == 0
        assert index.resume_from(URL) == 6 and not index.lagging(URL)
        assert pool.workers[0].kv_events == "streaming"
