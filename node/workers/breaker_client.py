"""A WorkerClient that tells its worker's circuit breaker how each Generate ended.

The pool wraps every worker's client in one, so every request the pipeline sends (a prefill, a decode, a
retry) is counted, whichever transport carries it. A Generate stream ends in one of three ways:

- the worker finished it, or the caller stopped reading after the worker had answered (a stop string, n
  choices done): a success;
- ``WorkerFailed`` before or after the first message (connect errors, UNAVAILABLE, a broken stream, an
  engine-reported error): a failure, unless it is ``WorkerRejected`` (the request's fault): no verdict;
- the caller left before the worker answered anything (client gone, cancelled): no verdict.

Every other RPC passes through unobserved (health checks are the health loop's verdict).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Sequence
from typing import TypeVar

from node.errors import WorkerFailed
from node.routing.kv_events import KvEventBatch
from node.workers.breaker import CircuitBreaker
from node.workers.client import WorkerClient, WorkerRejected, worker_batches
from node.workers.kv_convert import EngineLoad
from node.workers.types import ModelInfo, WorkerOutput, WorkerRequest

log = logging.getLogger(__name__)

T = TypeVar("T")


class BreakerClient:
    def __init__(self, inner: WorkerClient, breaker: CircuitBreaker) -> None:
        self._inner = inner
        self._breaker = breaker

    @property
    def url(self) -> str:
        return self._inner.url

    @property
    def inner(self) -> WorkerClient:
        return self._inner

    def generate(self, request: WorkerRequest) -> AsyncGenerator[WorkerOutput, None]:
        return self._observed(self._inner.generate(request))

    def generate_batches(self, request: WorkerRequest) -> AsyncGenerator[Sequence[WorkerOutput], None]:
        """Generate's messages as lists of those that arrived together (one each where the client cannot tell)."""
        return self._observed(worker_batches(self._inner, request))

    async def _observed(self, stream: AsyncGenerator[T, None]) -> AsyncGenerator[T, None]:
        verdict: bool | None = None
        answered = False
        try:
            async for item in stream:
                answered = True
                yield item
            verdict = True
        except WorkerRejected:
            raise
        except WorkerFailed as exc:
            verdict = False
            if self._breaker.on_failure():
                log.warning("worker %s: circuit open after failed requests: %s", self.url, exc.message)
            raise
        finally:
            await stream.aclose()
            if verdict is None and answered:
                verdict = True  # the caller stopped reading a worker that was answering
            if verdict:
                self._breaker.on_success()
            elif verdict is None:
                self._breaker.on_release()

    async def model_info(self, *, timeout_s: float) -> ModelInfo:
        return await self._inner.model_info(timeout_s=timeout_s)

    async def health(self, *, timeout_s: float) -> bool:
        return await self._inner.health(timeout_s=timeout_s)

    async def loads(self, *, timeout_s: float) -> EngineLoad | None:
        return await self._inner.loads(timeout_s=timeout_s)

    def kv_events(
        self, start_sequence_number: int
    ) -> AsyncGenerator[tuple[KvEventBatch | None, EngineLoad | None], None]:
        return self._inner.kv_events(start_sequence_number)

    async def abort(self, request_ids: Sequence[str], *, timeout_s: float) -> None:
        await self._inner.abort(request_ids, timeout_s=timeout_s)

    async def close(self) -> None:
        await self._inner.close()
