"""A WorkerClient that tells its worker's circuit breaker how each Generate ended.

The pool wraps every worker's client in one, so every request the pipeline sends (a prefill, a decode, a
retry) is counted, whichever transport carries it. A Generate stream ends in one of three ways:

- the worker finished it, or the caller stopped reading after the worker had answered (a stop string, n
  choices done): a success;
- ``WorkerFailed`` before or after the first message (connect errors, UNAVAILABLE, a broken stream, an
  engine-reported error, a deadline, a broken contract): the outcome its class says (``outcome_of``): a
  failure, or no verdict for ``WorkerRejected`` (the request's fault) and the client's own timeout;
- the caller left before the worker answered anything (client gone, cancelled): no verdict.

A request's deadlines (``WorkerRequest.deadlines``) are applied inside the observation, so a worker that
stays silent fails with a ``WorkerTimeout`` its breaker counts (the client's own timeout excepted).

A fault the consumer finds in what the stream said (it ended before every choice finished, an unasked
abort, a broken contract) reaches the breaker through ``blame``, before the consumer closes the stream.

Every other RPC passes through unobserved (health checks are the health loop's verdict).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Sequence
from dataclasses import replace
from typing import TypeVar

from node.errors import WorkerFailed
from node.routing.kv_events import KvEventBatch
from node.workers.breaker import CircuitBreaker
from node.workers.client import WorkerClient, flattened, worker_batches
from node.workers.deadlines import Watchdog
from node.workers.kv_convert import EngineLoad
from node.workers.outcome import Outcome, outcome_of
from node.workers.types import ModelInfo, Pushed, WorkerOutput, WorkerRequest

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
        return flattened(self.generate_batches(request))

    def generate_batches(self, request: WorkerRequest) -> AsyncGenerator[Sequence[WorkerOutput], None]:
        """Generate's messages as lists of those that arrived together (one each where the client cannot tell)."""
        # Inside the observation (a tripped deadline is the worker's timeout), applied in its own loop: no
        # generator layer of its own per message.
        watch = (
            None if request.deadlines is None else Watchdog(request.deadlines, url=self.url, streamed=request.stream)
        )
        return self._observed(request, watch)

    async def _observed(
        self, request: WorkerRequest, watch: Watchdog | None
    ) -> AsyncGenerator[Sequence[WorkerOutput], None]:
        n = request.params.n
        outcome: Outcome | None = None
        answered = False
        finished: set[int] = set()  # choices the worker finished (indexes < n only: bounded)
        aborted = False  # a finish reason "abort": the gateway never asks for one on a stream it reads
        push = request.push
        if push is not None:
            # What a push takes is observed here too: it answers the request and moves the deadlines on. (It
            # takes no finish: those, and the outcome they decide, reach the loop below.)
            def observed_push(batch: Sequence[WorkerOutput]) -> Pushed:
                nonlocal answered
                verdict = push(batch)
                if verdict:
                    answered = True
                    if watch is not None:
                        watch.heard()
                return verdict

            request = replace(request, push=observed_push)
        stream = worker_batches(self._inner, request)
        try:
            while True:
                if watch is not None:
                    watch.waiting()
                try:
                    batch = await stream.__anext__()  # not anext(): one awaitable less per message
                except StopAsyncIteration:
                    if watch is not None:
                        watch.stopped_waiting()
                    break
                except asyncio.CancelledError:
                    timeout = watch.timeout() if watch is not None else None
                    if timeout is not None:
                        raise timeout from None
                    raise
                except BaseException:
                    if watch is not None:
                        watch.stopped_waiting()
                    raise
                if watch is not None:
                    watch.arrived()  # also ends the wait
                answered = True
                for out in batch:
                    if out.finish_reason is not None and 0 <= out.index < n:
                        finished.add(out.index)
                        aborted = aborted or out.finish_reason == "abort"
                yield batch
            outcome = Outcome.SUCCESS if len(finished) == n else Outcome.INCOMPLETE
        except WorkerFailed as exc:  # the worker's, or one the consumer threw in (``blame``)
            outcome = outcome_of(exc)
            raise
        finally:
            if watch is not None:
                watch.close()
            await stream.aclose()
            if outcome is None:
                # The caller stopped reading: a worker that was answering works; before that, no news.
                outcome = Outcome.SUCCESS if answered else Outcome.CLIENT_GONE
            if aborted and outcome in (Outcome.SUCCESS, Outcome.INCOMPLETE):
                outcome = Outcome.UNASKED_ABORT
            trial = self._breaker.state == "half_open"
            if self._breaker.record(outcome):
                log.warning("worker %s: circuit open after failed requests (last: %s)", self.url, outcome.value)
            elif trial and self._breaker.state == "closed":
                log.info("worker %s: circuit closed (a trial request succeeded)", self.url)

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

    async def connection_lost(self) -> None:
        await self._inner.connection_lost()

    async def close(self) -> None:
        await self._inner.close()


async def blame(stream: AsyncGenerator[T, None], error: WorkerFailed) -> None:
    """The consumer of a Generate stream rejects it for ``error``, a fault it found in what the worker sent:
    the worker's breaker counts ``error``'s outcome instead of a success, and the stream is closed. A stream
    that has ended already (it raised ``error`` itself, and was counted then) is left as it is."""
    with contextlib.suppress(WorkerFailed):
        await stream.athrow(error)
