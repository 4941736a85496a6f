"""The circuit breaker's state machine, on a clock the test moves."""

from __future__ import annotations

import pytest

from node.workers.breaker import CircuitBreaker


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def breaker(clock: Clock, failures: int = 3, open_s: float = 10.0) -> CircuitBreaker:
    return CircuitBreaker(failures_to_open=failures, open_s=open_s, clock=clock)


def test_opens_after_k_consecutive_failures_only() -> None:
    clock = Clock()
    b = breaker(clock)
    assert not b.on_failure() and not b.on_failure()
    b.on_success()  # a success in between: the count starts again
    assert not b.on_failure() and not b.on_failure()
    assert b.state == "closed" and b.admits()
    assert b.on_failure()
    assert b.state == "open" and not b.admits() and b.opens == 1


def test_cool_down_then_one_trial_whose_success_closes() -> None:
    clock = Clock()
    b = breaker(clock, failures=1)
    b.on_failure()
    clock.now += 9.9
    assert b.state == "open" and not b.admits()
    clock.now += 0.1
    assert b.state == "half_open" and b.admits()
    b.on_dispatch()  # the trial
    assert not b.admits(), "half-open lets one request through at a time"
    b.on_success()
    assert b.state == "closed" and b.admits() and b.consecutive_failures == 0


def test_a_failed_trial_opens_for_a_new_cool_down() -> None:
    clock = Clock()
    b = breaker(clock, failures=2)
    b.on_failure()
    b.on_failure()
    clock.now += 10.0
    b.on_dispatch()
    assert b.on_failure()
    assert b.state == "open" and b.opens == 2
    clock.now += 9.0
    assert not b.admits()
    clock.now += 1.0
    assert b.admits()


def test_outcomes_while_open_change_nothing() -> None:
    clock = Clock()
    b = breaker(clock, failures=1)
    b.on_failure()
    clock.now += 5.0
    b.on_success()  # a request sent before it opened, finishing late
    assert not b.on_failure()
    assert b.state == "open"
    clock.now += 5.0  # the cool-down counts from the opening, not from the late outcomes
    assert b.state == "half_open"


def test_a_released_or_lost_trial_lets_another_through() -> None:
    clock = Clock()
    b = breaker(clock, failures=1, open_s=10.0)
    b.on_failure()
    clock.now += 10.0
    b.on_dispatch()
    b.on_release()  # the client left before the worker answered: no verdict
    assert b.state == "half_open" and b.admits()
    b.on_dispatch()  # never heard of again
    clock.now += 9.0
    assert not b.admits()
    clock.now += 1.0
    assert b.admits(), "a lost trial must not keep the worker out forever"


def test_dispatch_while_closed_claims_nothing() -> None:
    clock = Clock()
    b = breaker(clock)
    b.on_dispatch()
    b.on_release()
    assert b.state == "closed" and b.admits()


@pytest.mark.parametrize(("failures", "open_s"), [(0, 1.0), (1, 0.0), (1, -1.0)])
def test_bad_settings_are_refused(failures: int, open_s: float) -> None:
    with pytest.raises(ValueError):
        CircuitBreaker(failures_to_open=failures, open_s=open_s, clock=Clock())
