"""node/http/history.py's pure parts: when the outage gate says the store answered lately."""

from __future__ import annotations

from node.http.history import PROBE_AFTER_S, OutageGate


def test_gate_remembers_when_the_store_last_answered() -> None:
    now = [100.0]
    gate = OutageGate(hold_s=1.0, clock=lambda: now[0])
    assert not gate.answered_within(PROBE_AFTER_S), "never heard from: a request that must write probes"
    gate.succeeded()
    now[0] += PROBE_AFTER_S
    assert gate.answered_within(PROBE_AFTER_S)
    now[0] += 0.01
    assert not gate.answered_within(PROBE_AFTER_S)
    gate.failed()
    assert not gate.answered_within(PROBE_AFTER_S) and gate.is_open()
    gate.succeeded()
    assert gate.answered_within(PROBE_AFTER_S) and not gate.is_open()
