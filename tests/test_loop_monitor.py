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
