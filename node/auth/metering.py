"""Per-request token metering without threading a request object through the pipeline: the limits
middleware opens a ``Meter`` in the request's context, and the generating endpoints' usage callback adds to
whichever meter is current (contextvars follow the request's task and the tasks it starts)."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import Final


@dataclass(slots=True)
class Meter:
    tokens: int = 0

    def add(self, prompt_tokens: int, completion_tokens: int) -> None:
        self.tokens += prompt_tokens + completion_tokens


CURRENT_METER: Final[ContextVar[Meter | None]] = ContextVar("smg_meter", default=None)


def record_usage(prompt_tokens: int, completion_tokens: int) -> None:
    """Add a finished generation's tokens to the current request's meter, if it has one."""
    meter = CURRENT_METER.get()
    if meter is not None:
        meter.add(prompt_tokens, completion_tokens)
