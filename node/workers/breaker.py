"""A worker's circuit breaker: a worker whose requests keep failing leaves rotation for a cool-down, then one
trial request decides whether it comes back. Pure: outcomes in, admission out; time from an injected clock.

    closed    --failure, the K-th in a row-->  open       (K = failures_to_open)
    open      --open_s elapsed-------------->  half_open
    half_open --the trial succeeds---------->  closed
    half_open --a failure------------------->  open       (a new cool-down)

Health checks are a separate verdict: a worker whose server answers them while its requests fail (a broken
engine behind a live endpoint) is what the breaker takes out. Outcomes of requests dispatched before the
circuit opened that end while it is open are no news of the worker now and change nothing.

Half-open admits one request at a time, the trial. A trial that ends with no verdict (the client left before
the worker answered) is released; a trial never heard of again (lost before it was sent) counts as released
after ``open_s``, so a lost trial cannot keep a worker out forever.

Which outcomes are failures is ``node.workers.outcome``'s to say (``record``): only the worker's own faults.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from node.workers.outcome import Outcome

CircuitState = Literal["closed", "open", "half_open"]
CIRCUIT_STATES: tuple[CircuitState, ...] = ("closed", "open", "half_open")


class CircuitBreaker:
    def __init__(self, *, failures_to_open: int, open_s: float, clock: Callable[[], float]) -> None:
        """Raises ValueError when ``failures_to_open`` < 1 or ``open_s`` <= 0."""
        if failures_to_open < 1:
            raise ValueError("failures_to_open must be >= 1")
        if not open_s > 0:
            raise ValueError("open_s must be > 0")
        self._failures_to_open = failures_to_open
        self._open_s = open_s
        self._clock = clock
        self._failures = 0  # consecutive failures
        # The state is derived from this: None closed, else open for ``open_s`` from it, then half-open.
        self._opened_at: float | None = None
        self._trial_at: float | None = None  # when the half-open trial was dispatched; None: none out
        self._opens = 0

    @property
    def state(self) -> CircuitState:
        if self._opened_at is None:
            return "closed"
        return "open" if self._clock() - self._opened_at < self._open_s else "half_open"

    @property
    def consecutive_failures(self) -> int:
        return self._failures

    @property
    def opens(self) -> int:
        """How many times the circuit has opened."""
        return self._opens

    def admits(self) -> bool:
        """Whether a request may be sent to the worker now (a query: it claims nothing)."""
        state = self.state
        if state == "closed":
            return True
        if state == "open":
            return False
        return self._trial_at is None or self._clock() - self._trial_at >= self._open_s

    def on_dispatch(self) -> None:
        """A request was sent to the worker; in half-open it is the trial."""
        if self.state == "half_open":
            self._trial_at = self._clock()

    def on_success(self) -> None:
        self._failures = 0
        if self.state == "half_open":  # the trial succeeded
            self._opened_at = self._trial_at = None

    def on_failure(self) -> bool:
        """A request failed because of the worker. Returns whether this opened the circuit."""
        state = self.state
        if state == "open":
            return False
        self._failures += 1
        if state == "closed" and self._failures < self._failures_to_open:
            return False
        self._opened_at = self._clock()
        self._trial_at = None
        self._opens += 1
        return True

    def record(self, outcome: Outcome) -> bool:
        """How a dispatched request ended: a worker fault counts as a failure, a success as one, anything
        else (the request's fault, the client gone) releases a half-open trial. Returns whether this opened
        the circuit."""
        verdict = outcome.verdict
        if verdict is None:
            self.on_release()
            return False
        if verdict:
            self.on_success()
            return False
        return self.on_failure()

    def on_release(self) -> None:
        """A request ended without a verdict on the worker: a trial it was frees the slot for another."""
        if self.state == "half_open":
            self._trial_at = None
