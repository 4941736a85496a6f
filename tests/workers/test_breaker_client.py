"""How each Generate's ending reaches the worker's circuit breaker (no sockets: a scripted inner client)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Sequence

import pytest

from node.errors import WorkerFailed
from node.routing.kv_events import KvEventBatch
from node.workers.breaker import CircuitBreaker
from node.workers.breaker_client import BreakerClient
from node.workers.client import WorkerRejected
from node.workers.kv_convert import EngineLoad
from node.workers.types import ModelInfo, SamplingParams, WorkerOutput, WorkerRequest

REQUEST = WorkerRequest(request_id="r", prompt_ids=(1, 2, 3), params=SamplingParams(max_tokens=4))


def out(k: int, finish: str | None = None) -> WorkerOutput:
    return WorkerOutput(
        index=0, token_ids=(k,), prompt_tokens=3, completion_tokens=k, cached_tokens=0, finish_reason=finish
    )


class Scripted:
    """Yields ``messages`` then raises ``error`` (if any); no generate_batches, like a minimal client."""

    def __init__(self, messages: int, error: WorkerFailed | None = None, *, hang: bool = False) -> None:
        self.messages = messages
        self.error = error
        self.hang = hang  # wait forever before the first message

    @property
    def url(self) -> str:
        return "grpc://w:1"

    async def generate(self, request: WorkerRequest) -> AsyncGenerator[WorkerOutput, None]:
        if self.hang:
            await asyncio.Event().wait()
        for k in range(self.messages):
            yield out(k + 1, "stop" if k + 1 == self.messages and self.error is None else None)
        if self.error is not None:
            raise self.error

    async def model_info(self, *, timeout_s: float) -> ModelInfo:
        raise NotImplementedError

    async def health(self, *, timeout_s: float) -> bool:
        return True

    async def loads(self, *, timeout_s: float) -> EngineLoad | None:
        return None

    async def kv_events(
        self, start_sequence_number: int
    ) -> AsyncGenerator[tuple[KvEventBatch | None, EngineLoad | None], None]:
        return
        yield  # an async generator that ends at once

    async def abort(self, request_ids: Sequence[str], *, timeout_s: float) -> None:
        return None

    async def connection_lost(self) -> None:
        await asyncio.Event().wait()  # the test says when the worker is gone

    async def close(self) -> None:
        return None


def half_open() -> CircuitBreaker:
    """A breaker in half-open with its trial out: any verdict shows in its state."""
    now = [0.0]
    b = CircuitBreaker(failures_to_open=1, open_s=1.0, clock=lambda: now[0])
    b.on_failure()
    now[0] = 1.0
    b.on_dispatch()
    return b


async def drain(client: BreakerClient, *, batches: bool) -> None:
    stream = client.generate_batches(REQUEST) if batches else client.generate(REQUEST)
    async with contextlib.aclosing(stream):
        async for _ in stream:
            pass


@pytest.mark.parametrize("batches", [False, True])
async def test_a_finished_stream_is_a_success(batches: bool) -> None:
    b = half_open()
    await drain(BreakerClient(Scripted(3), b), batches=batches)
    assert b.state == "closed"


@pytest.mark.parametrize("answered", [0, 2])
@pytest.mark.parametrize("batches", [False, True])
async def test_a_worker_failure_before_or_mid_stream_is_a_failure(answered: int, batches: bool) -> None:
    b = half_open()
    client = BreakerClient(Scripted(answered, WorkerFailed("worker w: Generate failed: UNAVAILABLE")), b)
    with pytest.raises(WorkerFailed):
        await drain(client, batches=batches)
    assert b.state == "open" and b.opens == 2


async def test_a_rejected_request_is_no_verdict() -> None:
    b = half_open()
    client = BreakerClient(Scripted(0, WorkerRejected("worker w: Generate failed: INVALID_ARGUMENT")), b)
    with pytest.raises(WorkerRejected):
        await drain(client, batches=True)
    assert b.state == "half_open" and b.admits(), "the trial was released, not failed"


async def test_leaving_after_an_answer_is_a_success_before_one_no_verdict() -> None:
    b = half_open()
    stream = BreakerClient(Scripted(5), b).generate(REQUEST)
    await anext(stream)
    await stream.aclose()  # a stop string matched: the worker was answering
    assert b.state == "closed"

    b = half_open()
    stream = BreakerClient(Scripted(5, hang=True), b).generate(REQUEST)
    waiting = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0)
    waiting.cancel()  # the client left before anything came back
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert b.state == "half_open" and b.admits()


async def test_consecutive_failures_open_a_closed_circuit() -> None:
    b = CircuitBreaker(failures_to_open=2, open_s=60.0, clock=lambda: 0.0)
    client = BreakerClient(Scripted(1, WorkerFailed("broken stream")), b)
    for _ in range(2):
        with pytest.raises(WorkerFailed):
            await drain(client, batches=False)
    assert b.state == "open"
