"""The push path of a Generate stream (``WorkerRequest.push``): messages handed to a callback as they arrive,
against the real simulated engine over our HTTP/2 client. What it takes never reaches the reader, what it
declines does, in order; it can wake the reader; a push that raises fails its own call, not the connection;
and the breaker's deadlines see pushed messages as traffic."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from node.errors import WorkerTimeout
from node.sim import SimModel, SimWorker, SimWorkerConfig, load_sim_model
from node.workers.breaker import CircuitBreaker
from node.workers.breaker_client import BreakerClient
from node.workers.deadlines import Deadlines, Limit
from node.workers.types import Pushed, SamplingParams, WorkerOutput, WorkerRequest
from node.workers.vllm_grpc import VllmGrpcClient
from tests.sim.conftest import write_llama3_folder

PROMPT = list(range(1000, 1040))
TOKENS = 40


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_llama3_folder(tmp_path_factory.mktemp("models") / "llama3")


@pytest.fixture(scope="module")
def sim_model(model_dir: Path) -> SimModel:
    return load_sim_model(SimWorkerConfig(model_path=str(model_dir)))


@pytest.fixture
async def client(model_dir: Path, sim_model: SimModel) -> AsyncIterator[VllmGrpcClient]:
    # One token per message, 2 ms apart: each arrives in a read of its own, as a live stream's do.
    config = SimWorkerConfig(
        model_path=str(model_dir), port=0, ttft_base_ms=0, ttft_per_uncached_token_ms=0, tpot_ms=2.0
    )
    async with SimWorker(config, sim_model) as worker:
        c = VllmGrpcClient(f"grpc://{worker.address}", generate_transport="h2")
        yield c
        await c.close()


def _request(request_id: str, **params: object) -> WorkerRequest:
    sampling = SamplingParams(**{"max_tokens": TOKENS, "temperature": 0.0, "seed": 7, "ignore_eos": True, **params})  # type: ignore[arg-type]
    return WorkerRequest(request_id, PROMPT, sampling)


def _final(outs: Sequence[WorkerOutput]) -> bool:
    """A push declines a finish, as Dispatch's does (the reader decides what a stream's end means)."""
    return any(o.finish_reason is not None for o in outs)


def _breaker(client: VllmGrpcClient) -> BreakerClient:
    return BreakerClient(client, CircuitBreaker(failures_to_open=5, open_s=1.0, clock=time.monotonic))


def _ids(outs: Sequence[WorkerOutput]) -> list[int]:
    return [t for o in outs if o.finish_reason is None for t in o.token_ids]


async def _pulled(client: VllmGrpcClient, request: WorkerRequest) -> list[int]:
    return _ids([o async for batch in client.generate_batches(request) for o in batch])


async def test_taken_messages_skip_the_reader_and_declined_ones_reach_it_in_order(client: VllmGrpcClient) -> None:
    want = await _pulled(client, _request("pull"))
    seen: list[tuple[str, list[int]]] = []  # (who, ids) in arrival order
    calls = 0

    def push(outs: Sequence[WorkerOutput]) -> Pushed:
        nonlocal calls
        calls += 1
        if calls % 3 == 0 or _final(outs):
            return Pushed.DECLINED  # every third read goes to the reader
        seen.append(("push", _ids(outs)))
        return Pushed.TAKEN

    finishes = 0
    async for batch in client.generate_batches(replace(_request("push"), push=push)):
        assert batch, "no empty batch without TAKEN_WAKE"
        seen.append(("read", _ids(batch)))
        finishes += sum(o.finish_reason is not None for o in batch)
    assert finishes == 1, "what the push declined reached the reader"
    assert [t for _, ids in seen for t in ids] == want, "every token exactly once, in order"
    assert any(who == "push" and ids for who, ids in seen) and any(who == "read" and ids for who, ids in seen)


async def test_a_declined_message_is_offered_again_with_the_next_ones(client: VllmGrpcClient) -> None:
    want = await _pulled(client, _request("pull"))
    offered: list[list[int]] = []
    taken: list[int] = []
    gate = {"open": False}

    def push(outs: Sequence[WorkerOutput]) -> Pushed:
        offered.append(_ids(outs))
        if not gate["open"] or _final(outs):
            return Pushed.DECLINED
        taken.extend(_ids(outs))
        return Pushed.TAKEN

    stream = client.generate_batches(replace(_request("again"), push=push))
    first = _ids(await anext(stream))  # what arrived first, declined
    gate["open"] = True
    await asyncio.sleep(0.02)  # more arrives while the reader is away: the push takes it
    rest = [t async for batch in stream for t in _ids(batch)]
    assert offered[0] == first[: len(offered[0])]
    assert taken, "once open, the push took what came"
    # (``rest``: what arrived with the stream's end, which is the reader's.)
    assert first + taken + rest == want, "nothing the push took overtook what it had declined"


async def test_taken_wake_hands_the_reader_an_empty_batch_then_the_rest(client: VllmGrpcClient) -> None:
    want = await _pulled(client, _request("pull"))
    calls = 0
    taken: list[int] = []

    def push(outs: Sequence[WorkerOutput]) -> Pushed:
        nonlocal calls
        calls += 1
        if calls > 3 or _final(outs):
            return Pushed.DECLINED
        taken.extend(_ids(outs))
        return Pushed.TAKEN_WAKE if calls == 3 else Pushed.TAKEN

    batches = [b async for b in client.generate_batches(replace(_request("wake"), push=push))]
    empties = [k for k, b in enumerate(batches) if not b]
    assert len(empties) == 1
    before = [t for b in batches[: empties[0]] for t in _ids(b)]
    after = [t for b in batches[empties[0] + 1 :] for t in _ids(b)]
    assert before + taken + after == want, "the wake-up comes where the push asked, before later messages"


async def test_a_push_that_raises_fails_its_call_and_the_connection_serves_on(client: VllmGrpcClient) -> None:
    calls = 0

    def push(outs: Sequence[WorkerOutput]) -> Pushed:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise RuntimeError("a bug in the push")
        return Pushed.TAKEN

    other = asyncio.create_task(_pulled(client, _request("bystander")))
    with pytest.raises(RuntimeError, match="a bug in the push"):
        async for _ in client.generate_batches(replace(_request("raises"), push=push)):
            pass
    assert calls == 2, "no push after it raised"
    assert len(await other) == TOKENS, "the call beside it, on the same connection, finished"
    assert len(await _pulled(client, _request("after"))) == TOKENS


async def test_pushed_messages_keep_the_idle_deadline_from_tripping(client: VllmGrpcClient) -> None:
    """A stream whose every message is pushed (the reader waits the whole time) is not silent: the idle
    deadline (here 150 ms, the answer takes at least 600 ms) moves on with each pushed message."""
    breaker = _breaker(client)
    deadlines = Deadlines(idle=Limit(0.15))
    taken: list[int] = []

    def push(outs: Sequence[WorkerOutput]) -> Pushed:
        if _final(outs):
            return Pushed.DECLINED
        taken.extend(_ids(outs))
        return Pushed.TAKEN

    request = replace(_request("steady", max_tokens=300), push=push, deadlines=deadlines)
    read = [o async for batch in breaker.generate_batches(request) for o in batch]
    assert read[-1].finish_reason == "length"
    assert len(taken) + len(_ids(read)) == 300 and len(taken) > 150


async def test_a_silent_worker_still_trips_the_idle_deadline_under_push(model_dir: Path, sim_model: SimModel) -> None:
    config = SimWorkerConfig(
        model_path=str(model_dir), port=0, ttft_base_ms=0, ttft_per_uncached_token_ms=0, tpot_ms=200.0
    )
    async with SimWorker(config, sim_model) as slow:
        inner = VllmGrpcClient(f"grpc://{slow.address}", generate_transport="h2")
        breaker = _breaker(inner)
        request = replace(_request("silent"), push=lambda outs: Pushed.TAKEN, deadlines=Deadlines(idle=Limit(0.05)))
        try:
            with pytest.raises(WorkerTimeout, match="went silent"):
                async for _ in breaker.generate_batches(request):
                    pass
        finally:
            await inner.close()
