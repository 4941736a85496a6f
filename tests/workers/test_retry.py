"""Retry policy: which faults move a request to another worker, how often, after what pause, and where."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncGenerator, Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from node.config import WorkerPoolConfig
from node.errors import WorkerFailed, WorkerProtocolError, WorkerTimeout
from node.routing.policy import RouteRequest
from node.routing.round_robin import RoundRobin
from node.tasks import Supervisor
from node.workers.breaker import CircuitBreaker
from node.workers.client import WorkerRejected, WorkerUnavailable
from node.workers.pool import WorkerPool
from node.workers.retry import RetryConfig, RetryPolicy, retryable
from node.workers.types import ModelInfo, WorkerOutput, WorkerRequest


def policy(attempts: int = 3, base: float = 0.05, cap: float = 1.0, seed: int = 0) -> RetryPolicy:
    return RetryPolicy(RetryConfig(attempts, base, cap), random.Random(seed))


UNREACHABLE = WorkerUnavailable("worker w: Generate failed: UNAVAILABLE: failed to connect")
SILENT = WorkerTimeout("worker w sent nothing within 60 s", kind="first_token", received=False)


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (UNREACHABLE, True),
        (SILENT, True),
        (WorkerTimeout("silent", kind="idle", received=True), False),
        (WorkerTimeout("client gave up", kind="request", received=False, client_bound=True), False),
        (WorkerRejected("worker w: Generate failed: INVALID_ARGUMENT: prompt too long"), False),
        (WorkerProtocolError("token id 999999 outside the vocabulary"), False),
        (WorkerFailed("the worker reported an error while generating"), False),
    ],
)
def test_only_faults_another_worker_may_not_have_are_retried(error: WorkerFailed, expected: bool) -> None:
    assert retryable(error) is expected
    assert (policy().next_pause(error, attempt=1, received=False) is not None) is expected


def test_nothing_is_retried_once_the_worker_answered_or_attempts_ran_out() -> None:
    p = policy(attempts=3)
    assert p.next_pause(UNREACHABLE, attempt=1, received=True) is None
    assert p.next_pause(UNREACHABLE, attempt=2, received=False) is not None
    assert p.next_pause(UNREACHABLE, attempt=3, received=False) is None
    assert policy(attempts=1).next_pause(UNREACHABLE, attempt=1, received=False) is None


@given(seed=st.integers(0, 2**32), retry=st.integers(1, 200))
def test_backoff_is_full_jitter_under_a_doubling_cap(seed: int, retry: int) -> None:
    pause = policy(base=0.05, cap=1.0, seed=seed).backoff_s(retry)
    assert 0.0 <= pause <= min(1.0, 0.05 * 2 ** (retry - 1))


def test_backoff_is_spread_and_reproducible() -> None:
    pauses = [policy(base=1.0, cap=1.0, seed=s).backoff_s(1) for s in range(200)]
    assert min(pauses) < 0.1 and max(pauses) > 0.9  # full jitter: the whole range, not a fixed step
    assert policy(seed=7).backoff_s(3) == policy(seed=7).backoff_s(3)


def test_bad_retry_config_is_refused() -> None:
    with pytest.raises(ValueError, match="retry_max_attempts"):
        RetryConfig(retry_max_attempts=0)
    with pytest.raises(ValueError, match="retry_backoff_max_s"):
        RetryConfig(retry_backoff_max_s=float("inf"))


class Idle:
    """A WorkerClient that is never asked to generate here."""

    def __init__(self, url: str) -> None:
        self.url = url

    async def model_info(self, *, timeout_s: float) -> ModelInfo:
        return ModelInfo("m", "", 8192, 1000)

    async def health(self, *, timeout_s: float) -> bool:
        return True

    async def generate(self, request: WorkerRequest) -> AsyncGenerator[WorkerOutput, None]:
        raise AssertionError("not called")
        yield  # pragma: no cover

    async def abort(self, request_ids: Sequence[str], *, timeout_s: float) -> None:
        return None

    async def close(self) -> None:
        return None


async def test_the_pool_offers_excluded_workers_only_when_no_other_is_left() -> None:
    urls = ("grpc://a:1", "grpc://b:1", "grpc://c:1")
    async with Supervisor() as sup:
        pool = WorkerPool(
            WorkerPoolConfig(workers=urls),
            client_factory=Idle,  # type: ignore[arg-type]
            policies=lambda _role, _model: RoundRobin(),
            policy_name="round_robin",
            breakers=lambda: CircuitBreaker(failures_to_open=3, open_s=1.0, clock=time.monotonic),
            supervisor=sup,
        )
        for w in pool.workers:
            w.healthy = True
        for _ in range(6):
            chosen = pool.select(RouteRequest(prompt_ids=[1], exclude=frozenset(urls[:2])))
            assert chosen.url == urls[2]
        assert pool.select(RouteRequest(prompt_ids=[1], exclude=frozenset(urls))).url in urls
        await asyncio.sleep(0)
