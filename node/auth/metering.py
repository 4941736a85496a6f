"""Per-request token metering without threading a request object through the pipeline: the limits
middleware opens a ``Meter`` in the request's context, and the generating endpoints' usage callback adds to
whichever meter is current (contextvars follow the request's task and the tasks it starts)."""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Final


@dataclass(slots=True)
class Meter:
    tokens: int = 0
    # Reserves a prepared request's token budget under its identity's limits; raises RateLimited (None:
    # the identity has no token limit).
    reserve: Callable[[int], None] | None = None

    def add(self, prompt_tokens: int, completion_tokens: int) -> None:
        self.tokens += prompt_tokens + completion_tokens


CURRENT_METER: Final[ContextVar[Meter | None]] = ContextVar("smg_meter", default=None)


def record_usage(prompt_tokens: int, completion_tokens: int) -> None:
    """Add a finished generation's tokens to the current request's meter, if it has one."""
    meter = CURRENT_METER.get()
    if meter is not None:
        meter.add(prompt_tokens, completion_tokens)


def reserve_tokens(tokens: int) -> None:
    """Reserve a prepared request's tokens (prompt plus output budget) under the current request's limits,
    if it has any. Raises RateLimited when they do not fit."""
    meter = CURRENT_METER.get()
    if meter is not None and meter.reserve is not None:
        meter.reserve(tokens)
