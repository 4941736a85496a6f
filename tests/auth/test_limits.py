"""node/auth/limits.py and node/cluster/limiter.py: admission arithmetic, headers, settling, and the
fail-safe share, over a real ClusterState with an injected clock."""

from __future__ import annotations

from mesh.state import ClusterState
from node.auth.identity import Limits
from node.auth.limits import Usage, effective, format_duration, judge
from node.cluster.limiter import Admission, ClusterLimiter, Refusal, Scope


def test_judge_refuses_the_first_exhausted_limit_with_openai_headers() -> None:
    limits = Limits(requests_per_minute=10, tokens_per_minute=1000)
    ok = judge(limits, Usage(requests=3, tokens=100), share=1.0, now=30.0)
    assert ok.refused is None
    assert ok.headers["x-ratelimit-limit-requests"] == "10"
    assert ok.headers["x-ratelimit-remaining-requests"] == "6"
    assert ok.headers["x-ratelimit-remaining-tokens"] == "900"
    assert ok.headers["x-ratelimit-reset-requests"] == "30s" and "Retry-After" not in ok.headers
    full = judge(limits, Usage(requests=10), share=1.0, now=59.5)
    assert full.refused == "requests" and full.headers["Retry-After"] == "1"
    assert full.headers["x-ratelimit-remaining-requests"] == "0"
    spent = judge(limits, Usage(requests=1, tokens=1000), share=1.0, now=0.0)
    assert spent.refused == "tokens" and spent.headers["x-ratelimit-reset-tokens"] == "1m0s"
    assert judge(Limits(concurrent=2), Usage(concurrent=2), share=1.0, now=0).refused == "concurrent"


def test_share_and_durations() -> None:
    assert effective(0, 0.1) == 0 and effective(100, 1 / 3) == 33 and effective(2, 0.1) == 1
    assert format_duration(0.25) == "250ms" and format_duration(6.2) == "7s" and format_duration(360) == "6m0s"


def _limiter(alive: list[str] | None = None, start: float = 6000.0) -> tuple[ClusterLimiter, list[float]]:
    now = [start]
    state = ClusterState("n1")
    return ClusterLimiter(state, alive=lambda: alive, clock=lambda: now[0]), now


def test_requests_per_minute_admit_then_refuse_then_recover_in_the_next_window() -> None:
    limiter, now = _limiter()
    scope = Scope("k:abc", Limits(requests_per_minute=3))
    results = [limiter.admit([scope]) for _ in range(4)]
    assert [isinstance(r, Admission) for r in results] == [True, True, True, False]
    refusal = results[3]
    assert isinstance(refusal, Refusal) and refusal.verdict.refused == "requests"
    now[0] += 60
    assert isinstance(limiter.admit([scope]), Admission)
    assert limiter.refused["requests"] == 1


def test_tokens_are_charged_when_settled_and_refunds_stay_in_their_window() -> None:
    limiter, now = _limiter()
    scope = Scope("k:t", Limits(tokens_per_minute=100))
    first = limiter.admit([scope], reserve_tokens=60)
    assert isinstance(first, Admission)
    limiter.settle(first, 20)  # 40 refunded
    assert limiter.usage("k:t", now[0]).tokens == 20
    limiter.settle(first, 20)  # settling twice changes nothing
    assert limiter.usage("k:t", now[0]).tokens == 20
    second = limiter.admit([scope])
    assert isinstance(second, Admission)
    limiter.settle(second, 500)  # more than asked: charged in full
    assert isinstance(limiter.admit([scope]), Refusal)
    late = Admission((scope,), int(now[0] // 60), 80)
    now[0] += 60
    limiter.settle(late, 10)  # in the next window: charged 10, no refund of the old reservation
    assert limiter.usage("k:t", now[0]).tokens == 10


def test_concurrency_is_released_on_settle() -> None:
    limiter, _ = _limiter()
    scope = Scope("k:c", Limits(concurrent=2))
    a, b = limiter.admit([scope]), limiter.admit([scope])
    assert isinstance(a, Admission) and isinstance(b, Admission)
    assert isinstance(limiter.admit([scope]), Refusal)
    limiter.settle(a, 0)
    assert isinstance(limiter.admit([scope]), Admission)


def test_a_node_cut_off_from_its_cluster_enforces_its_share_and_says_so() -> None:
    alive = ["n1", "n2", "n3"]
    limiter, _ = _limiter(alive)
    assert limiter.share() == 1 / 3  # not yet synced with n2, n3: a third of each limit
    scope = Scope("k:p", Limits(requests_per_minute=30))
    admitted = sum(isinstance(limiter.admit([scope]), Admission) for _ in range(30))
    assert admitted == 10 and limiter.degraded
    del alive[1:]  # the others vanish: still a third, on what this node knows
    assert limiter.share() == 1 / 3


def test_key_and_tenant_limits_both_apply() -> None:
    limiter, _ = _limiter()
    key = Scope("k:1", Limits(requests_per_minute=100))
    tenant = Scope("t:x", Limits(requests_per_minute=2))
    other_key = Scope("k:2", Limits(requests_per_minute=100))
    assert isinstance(limiter.admit([key, tenant]), Admission)
    assert isinstance(limiter.admit([other_key, tenant]), Admission)
    refused = limiter.admit([key, tenant])
    assert isinstance(refused, Refusal) and refused.scope == tenant


def _pair(now: list[float]) -> tuple[ClusterLimiter, ClusterLimiter, ClusterState, ClusterState]:
    a, b = ClusterState("a"), ClusterState("b")
    a.merge_remote_state(b.local_state(True), True)  # synced both ways: each sees the whole cluster
    b.merge_remote_state(a.local_state(True), True)
    alive = ["a", "b"]
    return (
        ClusterLimiter(a, alive=lambda: alive, clock=lambda: now[0]),
        ClusterLimiter(b, alive=lambda: alive, clock=lambda: now[0]),
        a,
        b,
    )


def test_one_loaded_node_of_two_gets_the_whole_limit() -> None:
    """The peer-rate estimate costs no budget when the peers admit nothing."""
    now = [6000.0]
    limiter, _, a, _ = _pair(now)
    assert limiter.share() == 1.0
    scope = Scope("k:one", Limits(requests_per_minute=100))
    admitted = 0
    for _ in range(200):
        now[0] += 0.01
        a.tick(now[0], ["a", "b"])
        admitted += isinstance(limiter.admit([scope]), Admission)
    assert admitted == 100


def test_the_peers_measured_rate_counts_before_their_counts_arrive() -> None:
    """Two nodes admitting at the same rate, each seeing the other's counts only every 0.5 s: the cluster
    admits less over the limit with the estimate than the blind sum would."""
    now = [6000.0]
    la, lb, a, b = _pair(now)
    scope = Scope("k:two", Limits(requests_per_minute=150))
    admitted = 0
    for step in range(400):  # 100 requests/s on each node
        now[0] += 0.01
        admitted += isinstance(la.admit([scope]), Admission)
        admitted += isinstance(lb.admit([scope]), Admission)
        if step % 50 == 49:  # every 0.5 s each learns the other's published counts
            a.tick(now[0], ["a", "b"])
            b.tick(now[0], ["a", "b"])
            a.merge_remote_state(b.local_state(False), False)
            b.merge_remote_state(a.local_state(False), False)
    # Blind (BLIND_S = 0), each admits until its own 100 plus the 50 it last saw of the other reach the limit:
    # 200 in all. With the estimate, the limit.
    assert 150 <= admitted <= 160, admitted


def test_reserve_after_admission_refuses_what_does_not_fit_and_settles_to_actual_usage() -> None:
    limiter, now = _limiter()
    key = Scope("k:r", Limits(tokens_per_minute=100))
    tenant = Scope("t:r", Limits(requests_per_minute=10))  # no token limit: reserves nothing
    admission = limiter.admit([key, tenant])
    assert isinstance(admission, Admission)
    refused = limiter.reserve(admission, 101)
    assert isinstance(refused, Refusal) and refused.scope == key and refused.verdict.refused == "tokens"
    assert limiter.usage("k:r", now[0]).tokens == 0 and admission.reserved == 0  # nothing held
    assert limiter.reserve(admission, 70) is None
    assert admission.headers["x-ratelimit-remaining-tokens"] == "30"
    assert limiter.usage("k:r", now[0]).tokens == 70 and limiter.usage("t:r", now[0]).tokens == 0
    other = limiter.admit([key])
    assert isinstance(other, Admission) and isinstance(limiter.reserve(other, 31), Refusal)
    limiter.settle(admission, 25)  # 45 refunded
    assert limiter.usage("k:r", now[0]).tokens == 25
    assert limiter.reserve(other, 75) is None


def test_a_reservation_made_after_the_window_turned_is_refunded_in_its_own_window() -> None:
    limiter, now = _limiter(start=6059.9)
    scope = Scope("k:w", Limits(tokens_per_minute=100))
    admission = limiter.admit([scope])
    assert isinstance(admission, Admission)
    now[0] = 6060.1
    assert limiter.reserve(admission, 90) is None
    limiter.settle(admission, 10)
    assert limiter.usage("k:w", now[0]).tokens == 10
