"""Fault workers through the real gRPC contract, on both Generate transports: each misbehaves as described,
and the gateway's contract, deadlines and breaker contain it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from node.config import GenerateTransport
from node.errors import WorkerFailed, WorkerProtocolError, WorkerTimeout
from node.pipeline.worker_contract import LENGTH, ContractLimits, WorkerContract
from node.sim import SimModel, SimWorker, SimWorkerConfig
from node.sim.config import SimFault
from node.sim.faults import HUGE_CACHED_TOKENS
from node.workers.breaker import CircuitBreaker
from node.workers.breaker_client import BreakerClient
from node.workers.deadlines import Deadlines, Limit
from node.workers.types import SamplingParams, WorkerOutput, WorkerRequest
from node.workers.vllm_grpc import VllmGrpcClient
from tests.sim.conftest import replace

PROMPT = (1000, 1001, 1002, 1003)
MAX_TOKENS = 20
#: No fault test may take longer than this (a hang must be ended by a deadline, not by the test timing out).
BOUND_S = 10.0


@pytest.fixture(params=["h2", "grpc"])
def transport(request: pytest.FixtureRequest) -> GenerateTransport:
    return request.param  # type: ignore[no-any-return]


@contextlib.asynccontextmanager
async def faulty(
    config: SimWorkerConfig, model: SimModel, fault: SimFault, transport: GenerateTransport, **kw: int
) -> AsyncIterator[VllmGrpcClient]:
    async with SimWorker(replace(config, fault=fault, **kw), model) as worker:
        client = VllmGrpcClient(f"grpc://{worker.address}", generate_transport=transport)
        try:
            yield client
        finally:
            await client.close()


def req(deadlines: Deadlines | None = None, *, stream: bool = True) -> WorkerRequest:
    return WorkerRequest("r", PROMPT, SamplingParams(max_tokens=MAX_TOKENS), stream=stream, deadlines=deadlines)


async def first_messages(client: VllmGrpcClient, tokens: int) -> list[WorkerOutput]:
    """The outputs until they carry ``tokens`` ids or more (the h2 client merges messages that arrive together)."""
    got: list[WorkerOutput] = []
    stream = client.generate(req())
    async with contextlib.aclosing(stream):
        async with asyncio.timeout(BOUND_S):
            async for out in stream:
                got.append(out)
                if sum(len(o.token_ids) for o in got) >= tokens:
                    break
    return got


def contract(vocab: int) -> WorkerContract:
    return WorkerContract(ContractLimits(max_tokens=MAX_TOKENS, n=1, prompt_tokens=len(PROMPT), vocab_size=vocab))


async def test_hang_passes_health_checks_and_never_answers_until_a_deadline_ends_it(
    fast_config: SimWorkerConfig, sim_model: SimModel, transport: GenerateTransport
) -> None:
    async with faulty(fast_config, sim_model, "hang", transport) as client:
        assert await client.health(timeout_s=2)
        assert (await client.model_info(timeout_s=2)).vocab_size == sim_model.folder.vocab_size
        stream = client.generate(req())
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(anext(stream), 0.3)  # no deadline: it would wait forever
        await stream.aclose()
        breaker = CircuitBreaker(failures_to_open=3, open_s=60, clock=lambda: 0.0)
        guarded = BreakerClient(client, breaker)
        for k in range(3):
            assert breaker.state == "closed", k
            with pytest.raises(WorkerTimeout) as caught:
                async with asyncio.timeout(BOUND_S):
                    await anext(guarded.generate(req(Deadlines(first_token=Limit(0.2)))))
            assert caught.value.kind == "first_token" and caught.value.retryable
        assert breaker.state == "open"


async def test_the_clients_own_timeout_on_a_hung_worker_never_opens_its_circuit(
    fast_config: SimWorkerConfig, sim_model: SimModel, transport: GenerateTransport
) -> None:
    async with faulty(fast_config, sim_model, "hang", transport) as client:
        breaker = CircuitBreaker(failures_to_open=3, open_s=60, clock=lambda: 0.0)
        guarded = BreakerClient(client, breaker)
        for _ in range(10):
            with pytest.raises(WorkerTimeout):
                await anext(guarded.generate(req(Deadlines(request=Limit(0.05, client_bound=True)))))
        assert breaker.state == "closed" and breaker.consecutive_failures == 0


async def test_hang_after_streams_n_tokens_then_trips_the_idle_deadline(
    fast_config: SimWorkerConfig, sim_model: SimModel, transport: GenerateTransport
) -> None:
    async with faulty(fast_config, sim_model, "hang_after", transport, fault_after_tokens=3) as client:
        breaker = CircuitBreaker(failures_to_open=1, open_s=60, clock=lambda: 0.0)
        got: list[int] = []
        with pytest.raises(WorkerTimeout) as caught:
            async with asyncio.timeout(BOUND_S):
                stream = BreakerClient(client, breaker).generate(req(Deadlines(idle=Limit(0.2))))
                async for out in stream:
                    got.extend(out.token_ids)
        assert len(got) == 3 and caught.value.kind == "idle" and not caught.value.retryable
        assert breaker.state == "open"


async def test_endless_streams_past_max_tokens_and_the_contract_cuts_it(
    fast_config: SimWorkerConfig, sim_model: SimModel, transport: GenerateTransport
) -> None:
    async with faulty(fast_config, sim_model, "endless", transport) as client:
        messages = await first_messages(client, 5 * MAX_TOKENS)
        assert sum(len(m.token_ids) for m in messages) >= 5 * MAX_TOKENS  # the worker ignores max_tokens
        checker = contract(sim_model.folder.vocab_size)
        relayed: list[int] = []
        for m in messages:
            verdict = checker.check(m)
            relayed += [t for o in verdict.outputs if o.finish_reason is None for t in o.token_ids]
            if verdict.abort_stream:
                assert verdict.outputs[-1].finish_reason == LENGTH
                break
        assert len(relayed) == MAX_TOKENS


async def test_one_oversized_chunk_arrives_and_is_cut_to_max_tokens(
    fast_config: SimWorkerConfig, sim_model: SimModel, transport: GenerateTransport
) -> None:
    async with faulty(fast_config, sim_model, "oversized", transport, fault_chunk_tokens=3_000_000) as client:
        (chunk,) = await first_messages(client, 1)
        assert len(chunk.token_ids) == 3_000_000
        verdict = contract(sim_model.folder.vocab_size).check(chunk)
        assert [len(o.token_ids) for o in verdict.outputs] == [MAX_TOKENS, MAX_TOKENS]
        assert verdict.abort_stream and verdict.overrun


@pytest.mark.parametrize(
    ("fault", "match"),
    [("out_of_vocab", "outside the vocabulary"), ("huge_cached", f"{HUGE_CACHED_TOKENS} cached tokens")],
)
async def test_bad_ids_and_counts_pass_the_client_and_the_contract_refuses_them(
    fast_config: SimWorkerConfig, sim_model: SimModel, transport: GenerateTransport, fault: SimFault, match: str
) -> None:
    vocab = sim_model.folder.vocab_size
    async with faulty(fast_config, sim_model, fault, transport) as client:
        (first,) = await first_messages(client, 1)
        assert max(first.token_ids) == vocab if fault == "out_of_vocab" else first.cached_tokens == HUGE_CACHED_TOKENS
        with pytest.raises(WorkerProtocolError, match=match):
            contract(vocab).check(first)


@pytest.mark.parametrize("fault", ["garbage", "wrong_message"])
async def test_unreadable_messages_fail_the_request(
    fast_config: SimWorkerConfig, sim_model: SimModel, transport: GenerateTransport, fault: SimFault
) -> None:
    async with faulty(fast_config, sim_model, fault, transport) as client:
        with pytest.raises(WorkerFailed) as caught:
            await first_messages(client, 1)
        assert type(caught.value) is WorkerFailed  # a worker fault, neither rejected nor retryable
