"""The connection cap's bookkeeping (node/http/connections.py ConnectionGate), without sockets: who is evicted,
when a connection is refused, and how often that is logged."""

from __future__ import annotations

import logging

import pytest

from node.http.connections import CAP_LOG_INTERVAL_S, HANDSHAKE_SLACK_S, ConnectionGate, ConnectionLimits


class FakeConnection:
    def __init__(self, name: str) -> None:
        self.name = name
        self.counted = True
        self.aborted = False

    def abort(self) -> None:
        self.aborted = True


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _gate(cap: int, clock: Clock) -> ConnectionGate:
    limits = ConnectionLimits(
        max_connections=cap, idle_timeout_s=75, header_timeout_s=20, body_timeout_s=60, write_timeout_s=30
    )
    return ConnectionGate(limits, clock=clock)


def _open(gate: ConnectionGate, name: str, *, waiting: bool) -> FakeConnection:
    assert gate.admit()
    conn = FakeConnection(name)
    gate.waiting(conn, waiting)  # type: ignore[arg-type]  # the gate only uses counted and abort()
    return conn


def test_at_the_cap_the_connection_waiting_longest_makes_room() -> None:
    gate = _gate(3, Clock())
    a, b = _open(gate, "a", waiting=True), _open(gate, "b", waiting=True)
    busy = _open(gate, "busy", waiting=False)
    gate.waiting(a, False)  # type: ignore[arg-type]  # a starts a request...
    gate.waiting(a, True)  # type: ignore[arg-type]  # ...and waits again: now the newest
    assert gate.admit()
    assert b.aborted and not a.aborted and not busy.aborted
    assert gate.open == 3 and gate.closed["evicted"] == 1 and gate.refused == 0
    gate.release(b)  # type: ignore[arg-type]  # its connection_lost comes later: counted once
    assert gate.open == 3


def test_at_the_cap_with_every_connection_busy_a_new_one_is_refused() -> None:
    gate = _gate(2, Clock())
    first = _open(gate, "1", waiting=False)
    _open(gate, "2", waiting=False)
    assert not gate.admit()
    assert gate.refused == 1 and gate.open == 2
    gate.release(first)  # type: ignore[arg-type]
    assert gate.admit()


def test_the_cap_is_logged_at_once_then_at_most_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="node.http.connections")
    clock = Clock()
    gate = _gate(1, clock)
    _open(gate, "busy", waiting=False)
    for _ in range(5):
        assert not gate.admit()
    clock.now += CAP_LOG_INTERVAL_S
    assert not gate.admit()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert "1 new connection(s) refused" in lines[0]
    assert "5 new connection(s) refused" in lines[1] and "in the last 10 s" in lines[1]
    assert gate.refused == 6


def test_a_handshake_that_never_reaches_the_protocol_gives_its_place_back_after_the_deadline() -> None:
    clock = Clock()
    gate = _gate(2, clock)
    assert gate.admit("a") and gate.admit("b")
    assert gate.started("a")  # "a" reached its protocol; "b" failed its handshake, silently
    assert not gate.admit("c")  # at the cap, nobody waiting to evict
    clock.now = 20 + HANDSHAKE_SLACK_S + 0.1  # past header_timeout_s: "b" will never start
    assert gate.admit("c")
    assert gate.open == 2
    assert not gate.started("b")
