"""How a worker request ended, as its circuit breaker counts it.

Only the worker's own faults count against it: an error or broken stream, a deadline it missed, a broken
Generate contract, a stream that ended before every choice finished, an ``abort`` finish reason the gateway
did not ask for. A request the worker refused as bad (``WorkerRejected``: another worker would refuse it too),
a client that left or whose own timeout passed, and an abort the gateway sent are no verdict on the worker:
ten of them on a healthy worker must not open its circuit.
"""

from __future__ import annotations

import asyncio
import enum

from node.errors import WorkerAborted, WorkerFailed, WorkerIncomplete, WorkerProtocolError, WorkerTimeout
from node.workers.client import WorkerRejected


class Outcome(enum.Enum):
    SUCCESS = "success"  # finished, or the gateway stopped reading a worker that was answering
    WORKER_ERROR = "worker_error"  # unreachable, RPC error, broken stream, engine-reported error
    TIMEOUT = "timeout"  # a node deadline tripped (request, first token, idle)
    PROTOCOL_VIOLATION = "protocol_violation"  # the Generate contract broken (ids, indexes, counts, overrun)
    INCOMPLETE = "incomplete"  # the stream ended before every choice finished
    UNASKED_ABORT = "unasked_abort"  # a finish reason "abort" the gateway did not ask for
    REJECTED = "rejected"  # the worker refused the request as bad: the request's fault
    CLIENT_GONE = "client_gone"  # the client left, or its own timeout passed, before the worker answered

    @property
    def verdict(self) -> bool | None:
        """True: the worker works; False: a fault of the worker; None: no news of the worker."""
        if self is Outcome.SUCCESS:
            return True
        if self in (Outcome.REJECTED, Outcome.CLIENT_GONE):
            return None
        return False


def outcome_of(error: BaseException) -> Outcome:
    """The outcome of a request that ended with ``error`` (most specific class first)."""
    if isinstance(error, WorkerRejected):
        return Outcome.REJECTED
    if isinstance(error, WorkerTimeout):
        return Outcome.CLIENT_GONE if error.client_bound else Outcome.TIMEOUT
    if isinstance(error, WorkerProtocolError):
        return Outcome.PROTOCOL_VIOLATION
    if isinstance(error, WorkerIncomplete):
        return Outcome.INCOMPLETE
    if isinstance(error, WorkerAborted):
        return Outcome.UNASKED_ABORT
    if isinstance(error, WorkerFailed):
        return Outcome.WORKER_ERROR
    if isinstance(error, (asyncio.CancelledError, GeneratorExit)):
        return Outcome.CLIENT_GONE
    raise TypeError(f"no breaker outcome for {type(error).__name__}") from error
