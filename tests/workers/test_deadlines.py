"""Worker stream deadlines: the pure state, the client's timeout headers, and the asyncio wrapper."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from node.errors import WorkerFailed, WorkerTimeout
from node.workers.deadlines import (
    READ_TIMEOUT_HEADER,
    TOTAL_TIMEOUT_HEADER,
    DeadlineConfig,
    Deadlines,
    Limit,
    StreamDeadline,
    bounded,
    deadlines_for,
)

limits = st.one_of(st.none(), st.builds(Limit, st.floats(0.01, 1000), st.booleans()))


@given(
    request=limits,
    first=limits,
    idle=limits,
    streamed=st.booleans(),
    gaps=st.lists(st.floats(0, 500), max_size=10),
    probe=st.floats(0, 3000),
)
def test_a_deadline_trips_exactly_when_the_tightest_applicable_bound_passed(
    request: Limit | None, first: Limit | None, idle: Limit | None, streamed: bool, gaps: list[float], probe: float
) -> None:
    state = StreamDeadline(Deadlines(request, first, idle), started_at=100.0, streamed=streamed)
    now = 100.0
    for gap in gaps:
        now += gap
        state.on_message(now)
    at = now + probe
    bounds = [100.0 + request.seconds] if request else []
    if streamed and not gaps and first:
        bounds.append(100.0 + first.seconds)
    if streamed and gaps and idle:
        bounds.append(now + idle.seconds)
    tripped = state.expired(at)
    assert (tripped is not None) == (bool(bounds) and at >= min(bounds))
    assert state.received == bool(gaps)


def test_a_non_streamed_call_has_only_the_request_deadline() -> None:
    state = StreamDeadline(Deadlines(Limit(600), Limit(1), Limit(1)), started_at=0.0, streamed=False)
    assert state.expired(599.0) is None
    assert state.expired(600.0) == ("request", Limit(600))


def test_the_client_header_tightens_never_loosens() -> None:
    config = DeadlineConfig(request_timeout_s=600, first_token_timeout_s=120, inter_token_timeout_s=60)
    d = deadlines_for(config, {TOTAL_TIMEOUT_HEADER: "30"}, client_stream=True)
    assert d.request == Limit(30, client_bound=True)
    assert d.first_token == Limit(120) and d.idle == Limit(60)
    d = deadlines_for(config, {TOTAL_TIMEOUT_HEADER: "3600"}, client_stream=True)
    assert d.request == Limit(600)
    # Python SDK: a read timeout bounds each gap of a stream, the whole wait of a non-streamed answer.
    d = deadlines_for(config, {READ_TIMEOUT_HEADER: "10.5"}, client_stream=True)
    assert d.request == Limit(600) and d.first_token == d.idle == Limit(10.5, client_bound=True)
    d = deadlines_for(config, {READ_TIMEOUT_HEADER: "10.5"}, client_stream=False)
    assert d.request == Limit(10.5, client_bound=True) and d.first_token == Limit(120)


@pytest.mark.parametrize("raw", ["", "soon", "-5", "0", "nan", "inf", "1e400"])
def test_garbage_timeout_headers_are_ignored(raw: str) -> None:
    config = DeadlineConfig()
    assert deadlines_for(config, {TOTAL_TIMEOUT_HEADER: raw, READ_TIMEOUT_HEADER: raw}, client_stream=True) == (
        deadlines_for(config, {}, client_stream=True)
    )


def test_zero_switches_a_bound_off_and_bad_values_are_refused() -> None:
    d = deadlines_for(DeadlineConfig(0, 0, 0), {}, client_stream=True)
    assert d == Deadlines()
    d = deadlines_for(DeadlineConfig(0, 0, 0), {TOTAL_TIMEOUT_HEADER: "5"}, client_stream=True)
    assert d.request == Limit(5, client_bound=True)
    with pytest.raises(ValueError, match="inter_token_timeout_s"):
        DeadlineConfig(inter_token_timeout_s=-1)


async def tokens(count: int, *, then_hang: bool, gap_s: float = 0.0) -> AsyncGenerator[int, None]:
    for k in range(count):
        if gap_s:
            await asyncio.sleep(gap_s)
        yield k
    if then_hang:
        await asyncio.Event().wait()


async def drain(stream: AsyncGenerator[int, None]) -> list[int]:
    return [item async for item in stream]


async def test_a_worker_that_never_answers_trips_the_first_token_deadline_retryably() -> None:
    d = Deadlines(Limit(5), Limit(0.05), Limit(5))
    with pytest.raises(WorkerTimeout) as caught:
        await asyncio.wait_for(drain(bounded(tokens(0, then_hang=True), d, url="w")), 2)
    assert caught.value.kind == "first_token" and not caught.value.received and caught.value.retryable
    assert isinstance(caught.value, WorkerFailed) and caught.value.status == 504


async def test_a_worker_that_hangs_mid_stream_trips_the_idle_deadline_not_retryably() -> None:
    d = Deadlines(Limit(5), Limit(5), Limit(0.05))
    got: list[int] = []
    with pytest.raises(WorkerTimeout) as caught:
        async for item in bounded(tokens(3, then_hang=True), d, url="w"):
            got.append(item)  # noqa: PERF401 (the items before the raise are the point)
    assert got == [0, 1, 2] and caught.value.kind == "idle" and not caught.value.retryable


async def test_a_slow_steady_stream_trips_the_request_deadline() -> None:
    d = Deadlines(Limit(0.2), Limit(5), Limit(5))
    with pytest.raises(WorkerTimeout) as caught:
        await drain(bounded(tokens(1000, then_hang=False, gap_s=0.01), d, url="w"))
    assert caught.value.kind == "request" and caught.value.received


async def test_the_clients_timeout_is_no_worker_fault() -> None:
    d = Deadlines(Limit(0.05, client_bound=True))
    with pytest.raises(WorkerTimeout, match="the client's timeout") as caught:
        await drain(bounded(tokens(0, then_hang=True), d, url="w"))
    assert caught.value.client_bound and not caught.value.retryable


async def test_a_stream_within_its_deadlines_passes_unchanged_and_is_closed() -> None:
    closed = asyncio.Event()

    async def stream() -> AsyncGenerator[int, None]:
        try:
            for k in range(5):
                await asyncio.sleep(0.01)
                yield k
        finally:
            closed.set()

    assert await drain(bounded(stream(), Deadlines(Limit(5), Limit(1), Limit(1)), url="w")) == [0, 1, 2, 3, 4]
    assert closed.is_set()


async def test_a_steady_stream_outlasting_its_idle_bound_many_times_never_trips_it() -> None:
    # One timer per stream, re-armed when it fires early: it must follow the messages, not the stream's start.
    d = Deadlines(None, Limit(0.05), Limit(0.05))
    assert await drain(bounded(tokens(25, then_hang=False, gap_s=0.01), d, url="w")) == list(range(25))


async def test_a_tripped_deadline_leaves_the_consumer_task_uncancelled() -> None:
    d = Deadlines(None, Limit(0.02), None)
    with pytest.raises(WorkerTimeout):
        await drain(bounded(tokens(0, then_hang=True), d, url="w"))
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    await asyncio.sleep(0.01)  # a pending cancellation would surface here
