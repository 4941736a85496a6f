"""Only worker faults count against a worker's circuit: the request's faults and a client gone never do."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable, Sequence

import pytest

from node.errors import WorkerFailed, WorkerProtocolError, WorkerTimeout
from node.workers.breaker import CircuitBreaker
from node.workers.breaker_client import BreakerClient, blame
from node.workers.client import WorkerRejected, WorkerUnavailable
from node.workers.outcome import Outcome, outcome_of
from node.workers.types import SamplingParams, WorkerOutput, WorkerRequest

FAILURES_TO_OPEN = 3


def request(n: int = 1) -> WorkerRequest:
    return WorkerRequest(request_id="r", prompt_ids=(1, 2, 3), params=SamplingParams(max_tokens=8, n=n))


def out(index: int = 0, finish: str | None = None) -> WorkerOutput:
    return WorkerOutput(index=index, token_ids=(5,), prompt_tokens=3, completion_tokens=1, cached_tokens=0,
                        finish_reason=finish)  # fmt: skip


Script = Callable[[WorkerRequest], AsyncGenerator[WorkerOutput, None]]


class Worker:
    """A minimal WorkerClient whose Generate runs ``script`` (only generate is used here)."""

    url = "grpc://w:1"

    def __init__(self, script: Script) -> None:
        self.script = script

    def generate(self, req: WorkerRequest) -> AsyncGenerator[WorkerOutput, None]:
        return self.script(req)


def breaker() -> CircuitBreaker:
    return CircuitBreaker(failures_to_open=FAILURES_TO_OPEN, open_s=60.0, clock=lambda: 0.0)


def client_of(script: Script, b: CircuitBreaker) -> BreakerClient:
    return BreakerClient(Worker(script), b)  # type: ignore[arg-type]


async def finished(req: WorkerRequest) -> AsyncGenerator[WorkerOutput, None]:
    for k in range(req.params.n):
        yield out(k, "stop")


async def drain(stream: AsyncGenerator[Sequence[WorkerOutput], None]) -> None:
    async with contextlib.aclosing(stream):
        async for _ in stream:
            pass


async def test_ten_client_caused_failures_leave_a_healthy_workers_circuit_closed() -> None:
    b = breaker()
    await drain(client_of(finished, b).generate_batches(request()))

    async def rejected(req: WorkerRequest) -> AsyncGenerator[WorkerOutput, None]:
        raise WorkerRejected("worker w: Generate failed: INVALID_ARGUMENT: bad request")
        yield out()  # pragma: no cover

    async def clients_timeout(req: WorkerRequest) -> AsyncGenerator[WorkerOutput, None]:
        raise WorkerTimeout("client gave up", kind="request", received=False, client_bound=True)
        yield out()  # pragma: no cover

    async def slow(req: WorkerRequest) -> AsyncGenerator[WorkerOutput, None]:
        await asyncio.Event().wait()
        yield out()  # pragma: no cover

    for k in range(10):
        kind = k % 3
        if kind == 0:
            with pytest.raises(WorkerRejected):
                await drain(client_of(rejected, b).generate_batches(request()))
        elif kind == 1:
            with pytest.raises(WorkerTimeout):
                await drain(client_of(clients_timeout, b).generate_batches(request()))
        else:  # the client disconnects while the worker is still thinking
            task = asyncio.ensure_future(drain(client_of(slow, b).generate_batches(request())))
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
    assert b.state == "closed" and b.consecutive_failures == 0 and b.opens == 0


@pytest.mark.parametrize(
    "fault",
    [
        WorkerTimeout("worker w sent nothing within 60 s", kind="first_token", received=False),
        WorkerTimeout("worker w went silent within 30 s", kind="idle", received=True),
        WorkerUnavailable("worker w: Generate failed: UNAVAILABLE"),
    ],
)
async def test_worker_faults_open_the_circuit_after_n(fault: WorkerFailed) -> None:
    b = breaker()

    async def failing(req: WorkerRequest) -> AsyncGenerator[WorkerOutput, None]:
        yield out()
        raise fault

    for k in range(FAILURES_TO_OPEN):
        assert b.state == "closed", k
        with pytest.raises(type(fault)):
            await drain(client_of(failing, b).generate_batches(request()))
    assert b.state == "open" and b.opens == 1


async def test_a_stream_that_ends_before_every_choice_finished_is_a_worker_fault() -> None:
    b = breaker()

    async def one_of_two(req: WorkerRequest) -> AsyncGenerator[WorkerOutput, None]:
        yield out(0, "stop")
        yield out(1)  # choice 1 never finishes

    for _ in range(FAILURES_TO_OPEN):
        await drain(client_of(one_of_two, b).generate_batches(request(n=2)))
    assert b.state == "open"


@pytest.mark.parametrize("read_to_end", [True, False])
async def test_an_unasked_abort_is_a_worker_fault(read_to_end: bool) -> None:
    b = breaker()

    async def aborting(req: WorkerRequest) -> AsyncGenerator[WorkerOutput, None]:
        yield out(0, "abort")
        await asyncio.Event().wait() if not read_to_end else None

    for _ in range(FAILURES_TO_OPEN):
        stream = client_of(aborting, b).generate_batches(request())
        if read_to_end:
            await drain(stream)
        else:  # the consumer stops reading at the abort
            await anext(stream)
            await stream.aclose()
    assert b.state == "open"


async def test_a_fault_the_consumer_finds_is_counted_through_blame() -> None:
    b = breaker()

    async def endless(req: WorkerRequest) -> AsyncGenerator[WorkerOutput, None]:
        while True:
            yield out()

    for _ in range(FAILURES_TO_OPEN):
        stream = client_of(endless, b).generate_batches(request())
        await anext(stream)
        fault = WorkerProtocolError("worker w sent token id 999999 outside the vocabulary [0, 1000)")
        await blame(stream, fault)  # what the worker contract raised on the message just read
        with pytest.raises(StopAsyncIteration):
            await anext(stream)  # blame closed it
    assert b.state == "open"


async def test_blame_after_the_stream_raised_counts_once() -> None:
    b = breaker()

    async def broken(req: WorkerRequest) -> AsyncGenerator[WorkerOutput, None]:
        raise WorkerFailed("broken")
        yield out()  # pragma: no cover

    stream = client_of(broken, b).generate_batches(request())
    with pytest.raises(WorkerFailed) as caught:
        await anext(stream)
    await blame(stream, caught.value)
    assert b.consecutive_failures == 1


@pytest.mark.parametrize(
    ("error", "outcome"),
    [
        (WorkerRejected("bad"), Outcome.REJECTED),
        (WorkerTimeout("t", kind="idle", received=True), Outcome.TIMEOUT),
        (WorkerTimeout("t", kind="request", received=True, client_bound=True), Outcome.CLIENT_GONE),
        (WorkerProtocolError("p"), Outcome.PROTOCOL_VIOLATION),
        (WorkerUnavailable("u"), Outcome.WORKER_ERROR),
        (asyncio.CancelledError(), Outcome.CLIENT_GONE),
    ],
)
def test_outcome_of_errors(error: BaseException, outcome: Outcome) -> None:
    assert outcome_of(error) is outcome


def test_record_is_the_dispatch_stages_hook() -> None:
    b = breaker()
    for _ in range(10):
        assert not b.record(Outcome.REJECTED) and not b.record(Outcome.CLIENT_GONE)
    assert b.state == "closed" and b.consecutive_failures == 0
    assert not b.record(Outcome.TIMEOUT) and not b.record(Outcome.INCOMPLETE)
    b.record(Outcome.SUCCESS)
    assert b.consecutive_failures == 0
    assert [b.record(Outcome.UNASKED_ABORT) for _ in range(FAILURES_TO_OPEN)] == [False, False, True]
