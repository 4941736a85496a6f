"""The loop-lag monitor's recent window (pure, with an injected clock)."""

from __future__ import annotations

from node.loop_monitor import RECENT_S, LoopLagMonitor


def test_recent_lag_is_the_worst_of_the_window_asked_for_and_old_samples_are_dropped() -> None:
    now = [100.0]
    monitor = LoopLagMonitor(clock=lambda: now[0])
    assert monitor.recent_lag_s() == 0.0
    monitor.observe(1.5)  # a stall, measured at t=100
    now[0] = 101.0
    monitor.observe(0.001)
    assert monitor.recent_lag_s() == 1.5
    assert monitor.recent_lag_s(within_s=0.5) == 0.001  # the stall was before the last half second
    now[0] = 100.0 + RECENT_S + 0.1
    assert monitor.recent_lag_s() == 0.001
    now[0] = 101.0 + RECENT_S + 0.1
    assert monitor.recent_lag_s() == 0.0
    assert monitor.max_lag_s == 1.5


def test_the_worst_of_any_window_is_found_among_many_samples() -> None:
    now = [0.0]
    monitor = LoopLagMonitor(clock=lambda: now[0])
    samples = [(i * 0.05, ((i * 37) % 101) / 1000) for i in range(200)]  # 10 s of 50 ms ticks, lags jumbled
    for at, lag in samples:
        now[0] = at
        monitor.observe(lag)
    for within in (0.01, 0.2, 1.0, 3.3, RECENT_S):
        want = max((lag for at, lag in samples if at >= now[0] - within and at >= now[0] - RECENT_S), default=0.0)
        assert monitor.recent_lag_s(within) == want
