"""The whole pipeline (Prepare → Dispatch → Output, fan-out) against in-memory workers: no gRPC, no HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from node.errors import WorkerProtocolError, WorkerTimeout
from node.pipeline.context import RequestContext
from node.pipeline.cpu import CpuPool
from node.pipeline.events import ContentDelta, Event, Finish, Usage
from node.pipeline.pipeline import Pipeline
from node.pipeline.request import ChatPrompt, GenerateRequest, Sampling, TextPrompt
from node.pipeline.served_model import ServedModel, load_served_model
from node.tasks import Supervisor
from node.workers.client import WorkerUnavailable
from node.workers.deadlines import DeadlineConfig
from node.workers.memory import MemoryWorker, memory_pool
from node.workers.pool import WorkerPool
from node.workers.types import WorkerRequest

ANSWER = " It is a small fox."


@pytest.fixture(scope="module")
def model(llama3_model_dir: Path) -> ServedModel:
    return load_served_model(str(llama3_model_dir), served_name="llama3")


@contextlib.asynccontextmanager
async def pipeline_over(
    model: ServedModel,
    *workers: MemoryWorker,
    usages: list[Usage] | None = None,
    deadlines: DeadlineConfig | None = None,
) -> AsyncIterator[tuple[Pipeline, WorkerPool]]:
    cpu = CpuPool(threads=1)
    try:
        async with Supervisor() as sup:
            pool = memory_pool(workers, supervisor=sup)
            on_usage = usages.append if usages is not None else (lambda _u: None)
            yield (
                Pipeline(
                    models=[model], pool=pool, cpu=cpu, on_usage=on_usage, deadlines=deadlines, rng=random.Random(7)
                ),
                pool,
            )
            await asyncio.sleep(0)  # let abort tasks run before the supervisor closes
    finally:
        cpu.close()


def answering(model: ServedModel, text: str = ANSWER) -> MemoryWorker:
    ids = model.tokenizer.encode(text, add_special_tokens=False)
    return MemoryWorker("grpc://mem:1", reply=lambda r: [ids] * r.params.n)


def chat(max_tokens: int | None = None, n: int = 1) -> GenerateRequest:
    prompt = ChatPrompt(messages=[{"role": "user", "content": "What is it?"}])
    return GenerateRequest(
        model="llama3", prompts=(prompt,), sampling=Sampling(n=n, max_tokens=max_tokens), stream=True
    )


async def collect(pipeline: Pipeline, request: GenerateRequest, rid: str = "r1") -> list[list[Event]]:
    ctx = RequestContext(request_id="ctx-1", routing_key="k")
    model = pipeline.model(request.model)
    prepared = await pipeline.prepare(request, model, ctx, request_id=rid)
    run = pipeline.run(prepared, ctx)
    async with contextlib.aclosing(run.events()) as events:
        return [batch async for batch in events]


def text(batches: Sequence[Sequence[Event]], index: int = 0) -> str:
    return "".join(e.text for b in batches for e in b if isinstance(e, ContentDelta) and e.index == index)


async def test_a_chat_request_reads_top_down(model: ServedModel) -> None:
    worker = answering(model)
    usages: list[Usage] = []
    async with pipeline_over(model, worker, usages=usages) as (pipeline, _pool):
        batches = await collect(pipeline, chat())
    sent = worker.requests[0]
    rendered = model.template.render([{"role": "user", "content": "What is it?"}]) if model.template else ""
    assert list(sent.prompt_ids) == model.tokenizer.encode(rendered, add_special_tokens=False)
    assert sent.request_id == "r1" and sent.params.max_tokens == model.max_context_length - len(sent.prompt_ids)
    assert text(batches) == ANSWER
    answer_tokens = len(model.tokenizer.encode(ANSWER, add_special_tokens=False))
    assert batches[-1] == [Usage(prompt_tokens=len(sent.prompt_ids), completion_tokens=answer_tokens)]
    assert usages == batches[-1], "the metrics hook sees the final usage once"
    assert Finish(0, "stop") in batches[-2]


async def test_a_batch_fans_out_and_numbers_choices_across_it(model: ServedModel) -> None:
    worker = answering(model)
    request = GenerateRequest(
        model="llama3",
        prompts=(TextPrompt("one"), TextPrompt("two three")),
        sampling=Sampling(n=2, max_tokens=3),
        prompt_param="prompt",
    )
    async with pipeline_over(model, worker) as (pipeline, _pool):
        batches = await collect(pipeline, request, rid="cmpl-x")
    assert sorted(r.request_id for r in worker.requests) == ["cmpl-x-0", "cmpl-x-1"]
    events = [e for b in batches for e in b]
    assert sorted(e.index for e in events if isinstance(e, Finish)) == [0, 1, 2, 3]
    first_three = model.tokenizer.decode(
        model.tokenizer.encode(ANSWER, add_special_tokens=False)[:3], skip_special_tokens=True
    )
    assert all(text(batches, i) == first_three for i in range(4))
    usage = events[-1]
    prompts = sum(len(r.prompt_ids) for r in worker.requests)
    assert usage == Usage(prompt_tokens=prompts, completion_tokens=12)


async def test_an_unreachable_worker_fails_over(model: ServedModel) -> None:
    down = MemoryWorker("grpc://down:1", failure=WorkerUnavailable("connection refused"))
    up = answering(model)
    up.url = "grpc://up:1"
    async with pipeline_over(model, down, up) as (pipeline, _pool):
        batches = await collect(pipeline, chat())
    assert text(batches) == ANSWER and len(down.requests) == 1 and len(up.requests) == 1


async def test_a_consumer_that_leaves_aborts_the_worker(model: ServedModel) -> None:
    worker = answering(model, " a b c d e f g h")
    ctx = RequestContext(request_id="c")
    async with pipeline_over(model, worker) as (pipeline, _pool):
        prepared = await pipeline.prepare(chat(), model, ctx, request_id="r9")
        run = pipeline.run(prepared, ctx)
        async with contextlib.aclosing(run.events()) as events:
            await anext(events)
        pool_worker = run.dispatches[0].worker_url
    assert worker.aborted == ["r9"] and pool_worker == worker.url


async def test_the_budget_caps_the_answer(model: ServedModel) -> None:
    worker = answering(model)
    async with pipeline_over(model, worker) as (pipeline, _pool):
        batches = await collect(pipeline, chat(max_tokens=2))
    assert worker.requests[0].params.max_tokens == 2
    assert Finish(0, "length") in [e for b in batches for e in b]
    assert text(batches) == model.tokenizer.decode(
        model.tokenizer.encode(ANSWER, add_special_tokens=False)[:2], skip_special_tokens=True
    )


def _never(_r: WorkerRequest) -> list[list[int]]:
    raise AssertionError("nothing may reach a worker")


async def test_bad_input_reaches_no_worker(model: ServedModel) -> None:
    worker = MemoryWorker("grpc://mem:1", reply=_never)
    async with pipeline_over(model, worker) as (pipeline, _pool):
        with pytest.raises(Exception, match="temperature"):
            bad = GenerateRequest(model="llama3", prompts=chat().prompts, sampling=Sampling(temperature=3.0))
            await collect(pipeline, bad)
    assert worker.requests == []


# --- the worker contract, deadlines and retries, as Dispatch applies them -----------------------------------


async def test_a_worker_past_max_tokens_is_cut_aborted_and_blamed(model: ServedModel) -> None:
    worker = answering(model, " one two three four five six seven eight")
    worker.overrun = True
    async with pipeline_over(model, worker) as (pipeline, pool):
        batches = await collect(pipeline, chat(max_tokens=3))
        circuit = pool.workers[0].breaker
    events = [e for b in batches for e in b]
    assert Finish(0, "length") in events and text(batches) == " one two three"
    assert events[-1] == Usage(prompt_tokens=len(worker.requests[0].prompt_ids), completion_tokens=3)
    assert worker.aborted == ["r1"], "a worker that streams past its bound gets no more of the request"
    assert circuit.consecutive_failures == 1, "the overrun counts against the worker's circuit"


async def test_a_worker_silent_before_its_first_token_fails_over(model: ServedModel) -> None:
    hung = MemoryWorker("grpc://hung:1", hang=True)
    up = answering(model)
    up.url = "grpc://up:1"
    deadlines = DeadlineConfig(first_token_timeout_s=0.05)
    async with pipeline_over(model, hung, up, deadlines=deadlines) as (pipeline, _pool):
        batches = await collect(pipeline, chat())
    assert text(batches) == ANSWER
    assert len(hung.requests) == 1 and len(up.requests) == 1
    assert hung.aborted == [], "nothing started on the hung worker: its call is cancelled, nothing to abort"


async def test_ids_outside_the_vocabulary_are_a_worker_error(model: ServedModel) -> None:
    bad = MemoryWorker("grpc://bad:1", reply=lambda r: [[1, 2, model.tokenizer.vocab_size + 5]])
    async with pipeline_over(model, bad) as (pipeline, _pool):
        with pytest.raises(WorkerProtocolError, match="outside the vocabulary"):
            await collect(pipeline, chat())
    assert bad.aborted == ["r1"], "the stream had started: the worker request is aborted"


async def test_the_clients_own_timeout_is_not_retried(model: ServedModel) -> None:
    hung = MemoryWorker("grpc://hung:1", hang=True)
    other = answering(model)
    other.url = "grpc://other:1"
    ctx = RequestContext(request_id="t", headers={"x-stainless-read-timeout": "0.05"})
    async with pipeline_over(model, hung, other) as (pipeline, _pool):
        prepared = await pipeline.prepare(chat(), model, ctx, request_id="r1")
        run = pipeline.run(prepared, ctx)
        with pytest.raises(WorkerTimeout) as caught:
            async with contextlib.aclosing(run.events()) as events:
                async for _ in events:
                    pass
    assert caught.value.client_bound and other.requests == [], "the client gave up: no other worker is tried"
