"""Per-request token metering without threading a request object through the pipeline: the limits
middleware opens a ``Meter`` in the request's context; every run the pipeline starts for the request first
reserves its token budget through the meter and is then watched by it (contextvars follow the request's
task and the tasks it starts). The meter reads each run's usage when the request ends, however it ends, so
an aborted or failed run is charged what it used so far (its prompt and the tokens generated)."""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Final

#: A run's tokens so far, prompt plus completion (final once its events are exhausted).
TokensSoFar = Callable[[], int]


@dataclass(slots=True)
class Meter:
    # Reserves a prepared request's token budget under its identity's limits; raises RateLimited (None:
    # the identity has no token limit).
    reserve: Callable[[int], None] | None = None
    runs: list[TokensSoFar] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return sum(run() for run in self.runs)


CURRENT_METER: Final[ContextVar[Meter | None]] = ContextVar("smg_meter", default=None)


def meter_run(reserve_tokens: int, tokens_so_far: TokensSoFar) -> None:
    """Reserve a prepared run's tokens (prompt plus output budget) under the current request's limits, if
    it has any, then count the run's usage into the request's meter. Raises RateLimited when the tokens do
    not fit (the run is then not counted: it must not start)."""
    meter = CURRENT_METER.get()
    if meter is None:
        return
    if meter.reserve is not None:
        meter.reserve(reserve_tokens)
    meter.runs.append(tokens_so_far)
