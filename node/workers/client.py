"""The seam between the gateway and a GPU worker. The gRPC implementation is `node.workers.vllm_grpc`."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from typing import Protocol, cast

from node.errors import WorkerFailed
from node.routing.kv_events import KvEventBatch
from node.workers.kv_convert import EngineLoad
from node.workers.types import ModelInfo, WorkerOutput, WorkerRequest


class WorkerRejected(WorkerFailed):
    """The worker refused this one request with a status that blames the request (a bad argument, a
    duplicate id), not the worker: the client sees the same error, the worker's circuit breaker no failure.

    A 400, as the engine's reason is about the request (a grammar or schema its constrained decoder cannot
    compile, a prompt it will not take); another worker would refuse it too."""

    status = 400
    error_type = "invalid_request_error"
    code = "rejected_by_worker"


class WorkerUnavailable(WorkerFailed):
    """The worker could not take the request (gRPC UNAVAILABLE: connection refused or lost, the server
    shutting down): worth sending to another worker if nothing came back yet."""


class WorkerClient(Protocol):
    """One connection to one worker, reused by every request.

    Every method raises ``node.errors.WorkerFailed`` when the worker cannot be reached or reports an error;
    ``generate`` raises it only before it has yielded anything or when the stream breaks mid-way;
    ``WorkerRejected`` (a ``WorkerFailed``) when the worker refuses the request itself.
    """

    @property
    def url(self) -> str: ...

    async def model_info(self, *, timeout_s: float) -> ModelInfo: ...

    async def health(self, *, timeout_s: float) -> bool: ...

    def generate(self, request: WorkerRequest) -> AsyncGenerator[WorkerOutput, None]: ...

    async def loads(self, *, timeout_s: float) -> EngineLoad | None: ...

    def kv_events(
        self, start_sequence_number: int
    ) -> AsyncGenerator[tuple[KvEventBatch | None, EngineLoad | None], None]:
        """(batch, load record) pairs; (None, None) says only that the subscription is open."""
        ...

    async def abort(self, request_ids: Sequence[str], *, timeout_s: float) -> None: ...

    async def connection_lost(self) -> None:
        """Return once the connection to the worker, after being up, goes down (a worker process that exits
        closes it at once); never return when the client cannot tell. Raises WorkerFailed when there is no
        connection to watch (the worker's name leads nowhere allowed)."""
        ...

    async def close(self) -> None: ...


def worker_batches(client: WorkerClient, request: WorkerRequest) -> AsyncGenerator[Sequence[WorkerOutput], None]:
    """The worker's Generate stream as lists of the messages that arrived together (one each where the
    client cannot tell: it has no ``generate_batches``)."""
    batches = getattr(client, "generate_batches", None)
    if batches is not None:
        return cast("AsyncGenerator[Sequence[WorkerOutput], None]", batches(request))
    return _one_by_one(client.generate(request))


async def flattened(batches: AsyncGenerator[Sequence[WorkerOutput], None]) -> AsyncGenerator[WorkerOutput, None]:
    """``generate`` from ``generate_batches``: the batches' messages one by one (closing the batches when the
    caller stops early, so the worker request ends)."""
    try:
        async for batch in batches:
            for out in batch:
                yield out
    finally:
        await batches.aclose()


async def _one_by_one(stream: AsyncGenerator[WorkerOutput, None]) -> AsyncGenerator[Sequence[WorkerOutput], None]:
    try:
        async for out in stream:
            yield (out,)
    finally:
        await stream.aclose()
