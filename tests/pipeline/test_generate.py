"""The Dispatch and Output stages against a scripted worker: where answers end, exact usage, aborts, retries."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field

import pytest

from node.config import WorkerPoolConfig
from node.errors import WorkerFailed
from node.pipeline.dispatch import Dispatch, DispatchConfig
from node.pipeline.events import ContentDelta, Event, Finish, Usage
from node.pipeline.output import OutputProcessor
from node.pipeline.spec import GenerateSpec
from node.pipeline.tokenizer import Tokenizer
from node.routing.round_robin import RoundRobin
from node.tasks import Supervisor
from node.workers.breaker import CircuitBreaker
from node.workers.client import WorkerUnavailable
from node.workers.pool import WorkerPool
from node.workers.retry import RetryConfig, RetryPolicy
from node.workers.types import ModelInfo, SamplingParams, WorkerOutput, WorkerRequest

EOS = 128009


@dataclass
class ScriptedWorker:
    """A WorkerClient that plays back a fixed list of outputs (or fails), recording what it was asked."""

    url: str
    script: list[WorkerOutput] = field(default_factory=list)
    fail_before_output: bool = False
    fail_after: int | None = None
    requests: list[WorkerRequest] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)

    async def model_info(self, *, timeout_s: float) -> ModelInfo:
        return ModelInfo(served_model_name="m", model_path="", max_context_length=8192, vocab_size=128256)

    async def health(self, *, timeout_s: float) -> bool:
        return True

    async def generate(self, request: WorkerRequest) -> AsyncGenerator[WorkerOutput, None]:
        self.requests.append(request)
        if self.fail_before_output:
            raise WorkerUnavailable(f"worker {self.url}: connection refused")
        for k, out in enumerate(self.script):
            if self.fail_after is not None and k == self.fail_after:
                raise WorkerFailed("stream broke")
            await asyncio.sleep(0)
            yield out

    async def abort(self, request_ids: Sequence[str], *, timeout_s: float) -> None:
        self.aborted.extend(request_ids)

    async def close(self) -> None:
        return None


def chunk(ids: list[int], total: int, index: int = 0, finish: str | None = None) -> WorkerOutput:
    return WorkerOutput(
        index=index,
        token_ids=ids,
        prompt_tokens=3,
        completion_tokens=total,
        cached_tokens=0,
        finish_reason=finish,
    )


@contextlib.asynccontextmanager
async def pool_of(*workers: ScriptedWorker) -> AsyncGenerator[WorkerPool, None]:
    by_url = {w.url: w for w in workers}
    async with Supervisor() as sup:
        pool = WorkerPool(
            WorkerPoolConfig(workers=tuple(by_url)),
            client_factory=lambda u: by_url[u],
            policies=lambda _role, _model: RoundRobin(),
            policy_name="round_robin",
            # A circuit that never opens here: these tests are about the pipeline, not the breaker.
            breakers=lambda: CircuitBreaker(failures_to_open=1_000_000, open_s=1.0, clock=time.monotonic),
            supervisor=sup,
        )
        for w in pool.workers:
            w.healthy = True
        yield pool
        await asyncio.sleep(0)  # let abort tasks run before the supervisor closes


def spec(tok: Tokenizer, **kw: object) -> GenerateSpec:
    params = SamplingParams(
        max_tokens=int(kw.pop("max_tokens", 50)),
        n=int(kw.pop("n", 1)),  # type: ignore[call-overload]
        min_tokens=int(kw.pop("min_tokens", 0)),
    )  # type: ignore[call-overload]
    return GenerateSpec(request_id="r1", prompt_ids=[1, 2, 3], params=params, terminators=frozenset({EOS}), **kw)  # type: ignore[arg-type]


class Generation:
    """One spec through Dispatch (fed from ``pool``) and its Output stage, as the pipeline's Run wires them."""

    def __init__(self, spec: GenerateSpec, *, pool: WorkerPool, tokenizer: Tokenizer) -> None:
        self.output = OutputProcessor(spec, tokenizer)
        retry = RetryPolicy(RetryConfig(), random.Random(0))
        self.dispatch = Dispatch(spec, self.output, pool=pool, config=DispatchConfig(retry=retry))

    def deltas(self) -> AsyncGenerator[list[Event], None]:
        return self.dispatch.events()

    @property
    def usage(self) -> Usage:
        return self.output.usage

    @property
    def worker_url(self) -> str | None:
        return self.dispatch.worker_url


def text(events: Sequence[Event], index: int | None = None) -> str:
    return "".join(e.text for e in events if isinstance(e, ContentDelta) and index in (None, e.index))


def finishes(events: Sequence[Event]) -> list[str]:
    return [e.reason for e in events if isinstance(e, Finish)]


async def run(gen: Generation) -> list[Event]:
    out: list[Event] = []
    async with contextlib.aclosing(gen.deltas()) as it:
        async for batch in it:
            out.extend(batch)
    return out


def ids_of(tok: Tokenizer, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


async def test_eos_inside_a_chunk_ends_the_answer_and_aborts(llama3_tokenizer: Tokenizer) -> None:
    words = ids_of(llama3_tokenizer, " one two three")
    w = ScriptedWorker("grpc://a:1", [chunk(words[:2], 2), chunk([words[2], EOS, 555], 5)])
    async with pool_of(w) as pool:
        gen = Generation(spec(llama3_tokenizer), pool=pool, tokenizer=llama3_tokenizer)
        deltas = await run(gen)
    assert text(deltas) == " one two three"
    assert finishes(deltas) == ["stop"]
    assert gen.usage.completion_tokens == 4  # three words and the EOS, not the token after it
    assert w.aborted == ["r1"], "the worker kept going after EOS: it must be aborted"


async def test_stop_string_across_tokens_counts_exactly(llama3_tokenizer: Tokenizer) -> None:
    words = ids_of(llama3_tokenizer, " alpha beta gamma delta epsilon")
    script = [chunk([t], k + 1) for k, t in enumerate(words)]
    w = ScriptedWorker("grpc://a:1", script)
    async with pool_of(w) as pool:
        gen = Generation(spec(llama3_tokenizer, stops=("ta gam",)), pool=pool, tokenizer=llama3_tokenizer)
        deltas = await run(gen)
    assert text(deltas) == " alpha be"
    upto = len(ids_of(llama3_tokenizer, " alpha beta gamma"))
    assert gen.usage.completion_tokens == upto
    assert w.aborted == ["r1"]


async def test_worker_length_finish_and_repeated_final_ids(llama3_tokenizer: Tokenizer) -> None:
    words = ids_of(llama3_tokenizer, " a b c d")
    # vLLM's servicer: streamed chunks, then a final message repeating the last chunk's ids.
    script = [chunk(words[:2], 2), chunk(words[2:], 2), chunk(words[2:], 2, finish="length")]
    w = ScriptedWorker("grpc://a:1", script)
    async with pool_of(w) as pool:
        gen = Generation(spec(llama3_tokenizer, max_tokens=4), pool=pool, tokenizer=llama3_tokenizer)
        deltas = await run(gen)
    assert text(deltas) == " a b c d"
    assert deltas[-1] == Finish(0, "length")
    assert gen.usage.completion_tokens == 4
    assert w.aborted == [], "the worker finished by itself: nothing to abort"


async def test_n_choices_interleaved(llama3_tokenizer: Tokenizer) -> None:
    a, b = ids_of(llama3_tokenizer, " x y"), ids_of(llama3_tokenizer, " p q")
    script = [
        chunk(a[:1], 1, 0),
        chunk(b[:1], 1, 1),
        chunk(a[1:], 2, 0, "length"),
        chunk(b[1:], 2, 1, "length"),
    ]
    w = ScriptedWorker("grpc://a:1", script)
    async with pool_of(w) as pool:
        gen = Generation(spec(llama3_tokenizer, n=2, max_tokens=2), pool=pool, tokenizer=llama3_tokenizer)
        deltas = await run(gen)
    assert text(deltas, 0) == " x y"
    assert text(deltas, 1) == " p q"
    assert gen.usage.completion_tokens == 4 and w.aborted == []


async def test_min_tokens_holds_off_eos_and_stops(llama3_tokenizer: Tokenizer) -> None:
    words = ids_of(llama3_tokenizer, " stop here now")
    script = [chunk([words[0]], 1), chunk([EOS], 2), chunk(words[1:], 4, finish="length")]
    w = ScriptedWorker("grpc://a:1", script)
    async with pool_of(w) as pool:
        gen = Generation(spec(llama3_tokenizer, min_tokens=3, stops=(" stop",)), pool=pool, tokenizer=llama3_tokenizer)
        deltas = await run(gen)
    answer = text(deltas)
    assert answer.startswith(" stop") and answer.endswith(" here now")
    assert deltas[-1] == Finish(0, "length")


async def test_unreachable_worker_is_retried_on_another(llama3_tokenizer: Tokenizer) -> None:
    words = ids_of(llama3_tokenizer, " hi")
    down = ScriptedWorker("grpc://down:1", fail_before_output=True)
    up = ScriptedWorker("grpc://up:1", [chunk(words, 1, finish="length")])
    async with pool_of(down, up) as pool:
        gen = Generation(spec(llama3_tokenizer, max_tokens=1), pool=pool, tokenizer=llama3_tokenizer)
        deltas = await run(gen)
        assert [w.healthy for w in pool.workers] == [False, True]
    assert text(deltas) == " hi" and gen.worker_url == "grpc://up:1"


async def test_failure_after_output_is_not_retried(llama3_tokenizer: Tokenizer) -> None:
    words = ids_of(llama3_tokenizer, " a b c")
    broken = ScriptedWorker("grpc://a:1", [chunk([t], k + 1) for k, t in enumerate(words)], fail_after=2)
    other = ScriptedWorker("grpc://b:1", [])
    async with pool_of(broken, other) as pool:
        gen = Generation(spec(llama3_tokenizer), pool=pool, tokenizer=llama3_tokenizer)
        with pytest.raises(WorkerFailed):
            await run(gen)
    assert other.requests == [], "a half-streamed answer cannot be replayed elsewhere"


async def test_consumer_leaving_early_aborts(llama3_tokenizer: Tokenizer) -> None:
    words = ids_of(llama3_tokenizer, " a b c d e f")
    w = ScriptedWorker("grpc://a:1", [chunk([t], k + 1) for k, t in enumerate(words)])
    async with pool_of(w) as pool:
        gen = Generation(spec(llama3_tokenizer), pool=pool, tokenizer=llama3_tokenizer)
        async with contextlib.aclosing(gen.deltas()) as it:
            await anext(it)
    assert w.aborted == ["r1"]
    assert pool.workers[0].in_flight == 0


async def test_non_streaming_client_gets_one_final_message(llama3_tokenizer: Tokenizer) -> None:
    words = ids_of(llama3_tokenizer, " all at once")
    w = ScriptedWorker("grpc://a:1", [chunk(words, len(words), finish="length")])
    async with pool_of(w) as pool:
        gen = Generation(spec(llama3_tokenizer, client_stream=False), pool=pool, tokenizer=llama3_tokenizer)
        deltas = await run(gen)
    assert w.requests[0].stream is False, "no stop strings: the worker need not stream"
    assert text(deltas) == " all at once"
    assert gen.usage.completion_tokens == len(words)


@dataclass
class BatchingWorker(ScriptedWorker):
    """A worker client that hands over several messages at once, as the h2 transport does."""

    batches: list[list[WorkerOutput]] = field(default_factory=list)

    async def generate_batches(self, request: WorkerRequest) -> AsyncGenerator[list[WorkerOutput], None]:
        self.requests.append(request)
        for batch in self.batches:
            await asyncio.sleep(0)
            yield batch


async def test_messages_that_arrived_together_make_one_batch(llama3_tokenizer: Tokenizer) -> None:
    words = ids_of(llama3_tokenizer, " one two three four")
    w = BatchingWorker(
        "grpc://a:1",
        batches=[
            [chunk(words[:1], 1), chunk(words[1:2], 2), chunk(words[2:3], 3)],
            [chunk(words[3:], 4), chunk(words[3:], 4, finish="length")],
        ],
    )
    async with pool_of(w) as pool:
        gen = Generation(spec(llama3_tokenizer, max_tokens=4), pool=pool, tokenizer=llama3_tokenizer)
        async with contextlib.aclosing(gen.deltas()) as it:
            batches = [batch async for batch in it]
    assert len(batches) == 2, "three messages that arrived together must go out together"
    assert text([e for b in batches for e in b]) == " one two three four"
    assert batches[-1][-1] == Finish(0, "length") and gen.usage.completion_tokens == 4
    assert w.aborted == []
