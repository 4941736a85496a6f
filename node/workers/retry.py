"""When a failed worker request is sent again, and after how long. Pure: errors in, a pause or "give up" out.

A request moves to another worker only while nothing of it has reached the client (no message came back:
tokens already relayed cannot be taken back), only for faults another worker may not have (the worker could
not take the call, or stayed silent past the first-token deadline), and never for faults of the request
itself (``WorkerRejected``: another worker would refuse it too) or when the client has given up. Attempts
are bounded; the pause before each is drawn with "full jitter" (uniform in [0, min(cap, base * 2^k)]), so
requests failing together do not return together. Randomness is an injected ``random.Random``.

The caller excludes the workers it tried (``RouteRequest.exclude``): the pool offers another if one is in
rotation.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from node.errors import WorkerFailed, WorkerTimeout
from node.workers.client import WorkerRejected, WorkerUnavailable


@dataclass(frozen=True, slots=True)
class RetryConfig:
    retry_max_attempts: int = field(
        default=3,
        metadata={
            "help": "worker attempts per request, the first included, while nothing reached the client and "
            "the fault may be the worker's (unreachable, no first token in time); 1 = never retry"
        },
    )
    retry_backoff_base_s: float = field(
        default=0.05, metadata={"help": "cap of the random pause before the first retry; doubles per retry"}
    )
    retry_backoff_max_s: float = field(
        default=1.0, metadata={"help": "the random pause before a retry never exceeds this (seconds)"}
    )

    def __post_init__(self) -> None:
        if self.retry_max_attempts < 1:
            raise ValueError(f"retry_max_attempts must be >= 1, got {self.retry_max_attempts}")
        for name in ("retry_backoff_base_s", "retry_backoff_max_s"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")


def retryable(error: WorkerFailed) -> bool:
    """A fault another worker may not have. Never one of the request (WorkerRejected) or of a client gone."""
    if isinstance(error, WorkerRejected):
        return False
    if isinstance(error, WorkerTimeout):
        return error.retryable
    return isinstance(error, WorkerUnavailable)


class RetryPolicy:
    def __init__(self, config: RetryConfig, rng: random.Random) -> None:
        self._config = config
        self._rng = rng

    @property
    def max_attempts(self) -> int:
        return self._config.retry_max_attempts

    def backoff_s(self, retry: int) -> float:
        """The pause before retry number ``retry`` (1 = the second attempt): full jitter."""
        c = self._config
        ceiling = min(c.retry_backoff_max_s, c.retry_backoff_base_s * 2.0 ** min(retry - 1, 62))
        return self._rng.uniform(0.0, ceiling)

    def next_pause(self, error: WorkerFailed, *, attempt: int, received: bool) -> float | None:
        """After attempt number ``attempt`` (from 1) failed with ``error``: the pause before the next one,
        or None to give up (raise ``error``). ``received``: the worker had sent something."""
        if received or attempt >= self._config.retry_max_attempts or not retryable(error):
            return None
        return self.backoff_s(attempt)
