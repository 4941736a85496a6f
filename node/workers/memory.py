"""A WorkerClient in memory, beside the gRPC ones: the pipeline and the API adapters run against it in tests
and benchmarks without a gRPC server.

It streams as vLLM's servicer does: ``chunk_tokens`` ids per message (or, when ``chunk_sizes`` is given,
those sizes in turn, so a test can try any chunking), choices interleaved, each choice ending
with a final message that repeats its last chunk's ids (``repeat_final_chunk``); a non-streaming request gets
one final message per choice. A choice's answer is ``reply(request)[index]`` cut at ``max_tokens``: cut, it
finishes ``length``, else ``stop``. Faults are scripted: ``failure`` before any output, ``fail_after`` messages
into the stream, ``hang`` before the first message (until the caller cancels), ``overrun``: the whole reply
whatever ``max_tokens`` says (an engine breaking the Generate contract).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field

from node.config import WorkerPoolConfig
from node.errors import KvEventsUnsupported, WorkerFailed
from node.routing.kv_events import KvEventBatch
from node.routing.round_robin import RoundRobin
from node.tasks import Supervisor
from node.workers.breaker import CircuitBreaker
from node.workers.kv_convert import EngineLoad
from node.workers.pool import WorkerPool
from node.workers.types import ModelInfo, WorkerOutput, WorkerRequest

#: A memory pool's circuit breakers count failures up to this before opening: never, in practice (tests
#: of the pipeline are not about the breaker).
NEVER_OPENS = 1_000_000

#: The token ids of each of the request's n choices.
Reply = Callable[[WorkerRequest], Sequence[Sequence[int]]]

#: What ``model_info`` reports unless told otherwise: a Llama-3-sized vocabulary.
DEFAULT_INFO = ModelInfo(served_model_name="memory", model_path="", max_context_length=8192, vocab_size=128256)


def echo_prompt(request: WorkerRequest) -> Sequence[Sequence[int]]:
    """The default reply: every choice repeats the prompt's ids."""
    return [request.prompt_ids] * request.params.n


@dataclass(eq=False)
class MemoryWorker:
    url: str
    reply: Reply = echo_prompt
    info: ModelInfo = DEFAULT_INFO
    chunk_tokens: int = 1
    chunk_sizes: tuple[int, ...] = ()
    repeat_final_chunk: bool = True
    failure: WorkerFailed | None = None
    fail_after: int | None = None
    hang: bool = False
    overrun: bool = False
    cached_tokens: int = 0
    healthy: bool = True
    requests: list[WorkerRequest] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)

    async def model_info(self, *, timeout_s: float) -> ModelInfo:
        return self.info

    async def health(self, *, timeout_s: float) -> bool:
        return self.healthy

    async def generate(self, request: WorkerRequest) -> AsyncGenerator[WorkerOutput, None]:
        """Raises the scripted ``failure`` (before output) or WorkerFailed after ``fail_after`` messages."""
        self.requests.append(request)
        if self.failure is not None:
            raise self.failure
        if self.hang:
            await asyncio.Event().wait()
        for sent, out in enumerate(self._outputs(request)):
            if self.fail_after is not None and sent == self.fail_after:
                raise WorkerFailed(f"worker {self.url}: stream broke")
            await asyncio.sleep(0)
            yield out

    def _outputs(self, request: WorkerRequest) -> list[WorkerOutput]:
        params = request.params
        full = list(self.reply(request))[: params.n]
        bound = None if self.overrun else params.max_tokens
        answers = [list(ids[:bound]) for ids in full]
        finish = ["length" if len(ids) >= params.max_tokens else "stop" for ids in full]
        prompt = len(request.prompt_ids)

        def out(index: int, ids: Sequence[int], done: int, reason: str | None) -> WorkerOutput:
            return WorkerOutput(index, ids, prompt, done, self.cached_tokens, reason)

        if not request.stream:
            return [out(i, ids, len(ids), finish[i]) for i, ids in enumerate(answers)]
        sizes = self.chunk_sizes or (self.chunk_tokens,)
        outputs: list[WorkerOutput] = []
        # Each choice is cut at the same positions: sizes taken in turn (every size >= 1).
        cuts = [0]
        longest = max((len(a) for a in answers), default=0)
        while cuts[-1] < longest:
            cuts.append(cuts[-1] + max(1, sizes[(len(cuts) - 1) % len(sizes)]))
        for start, end in itertools.pairwise(cuts):
            for i, ids in enumerate(answers):
                if start < len(ids):
                    outputs.append(out(i, ids[start:end], min(end, len(ids)), None))
        for i, ids in enumerate(answers):
            last: Sequence[int] = []
            if ids and self.repeat_final_chunk:
                begin = max(c for c in cuts if c < len(ids))
                last = ids[begin : next(c for c in cuts if c > begin)]
            outputs.append(out(i, last, len(ids), finish[i]))
        return outputs

    async def loads(self, *, timeout_s: float) -> EngineLoad | None:
        return None

    async def kv_events(
        self, start_sequence_number: int
    ) -> AsyncGenerator[tuple[KvEventBatch | None, EngineLoad | None], None]:
        """Raises KvEventsUnsupported: the memory worker keeps no KV cache."""
        if start_sequence_number >= 0:  # always: the branch only makes this an async generator for mypy
            raise KvEventsUnsupported(f"worker {self.url} publishes no KV events")
        yield None, None

    async def abort(self, request_ids: Sequence[str], *, timeout_s: float) -> None:
        self.aborted.extend(request_ids)

    async def connection_lost(self) -> None:
        await asyncio.Event().wait()  # in-process: there is no connection to lose

    async def close(self) -> None:
        return None


def memory_pool(workers: Sequence[MemoryWorker], *, supervisor: Supervisor) -> WorkerPool:
    """A pool over ``workers`` (round robin, a circuit that never opens), every worker in rotation at once:
    no health checks run until ``start()``."""
    by_url = {w.url: w for w in workers}
    pool = WorkerPool(
        WorkerPoolConfig(workers=tuple(by_url)),
        client_factory=lambda url: by_url[url],
        policies=lambda _role, _model: RoundRobin(),
        policy_name="round_robin",
        breakers=lambda: CircuitBreaker(failures_to_open=NEVER_OPENS, open_s=1.0, clock=time.monotonic),
        supervisor=supervisor,
    )
    for worker in pool.workers:
        worker.healthy = True
    return pool
