"""When an HTTP/2 connection to a worker needs a PING, is dead, or has idled long enough to close: sans-IO.

The clock is the caller's (``now`` in every call). A worker that vanishes without a FIN or RST (host down,
process SIGSTOPped, a middlebox dropping the flow) leaves the socket open and silent; only an unanswered
PING tells. So:

- a connection with open calls that heard nothing for ``ping_after_s`` sends a PING; no ACK within
  ``timeout_s`` and it is dead (its calls fail UNAVAILABLE). A Generate stream of a live worker sends a
  message per few tokens, so silence means a queued or long prefill, or a vanished peer;
- pings are polite to gRPC servers' abuse policy (grpc core: a ping less than
  ``min_recv_ping_interval_without_data`` after the previous one, with no DATA/HEADERS sent in between, is
  a strike; the third strike closes the connection with ENHANCE_YOUR_CALM): the first ping after the
  server's data is free, the next ones wait twice and four times as long, and after
  ``MAX_PINGS_WITHOUT_DATA`` none until data arrives, so at most two strikes ever accrue;
- a connection with no open call for ``idle_timeout_s`` is closed (the next call reconnects), so an idle
  connection does not rot unnoticed behind a NAT or a load balancer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

#: Pings in one silence (no DATA/HEADERS received); the server's default max_ping_strikes is 2, and the
#: first ping after its data is no strike.
MAX_PINGS_WITHOUT_DATA = 3


class KeepaliveAction(Enum):
    NONE = "none"
    PING = "ping"  # send a PING with ``Keepalive.ping_payload``
    DEAD = "dead"  # no ACK in time: fail the connection
    IDLE = "idle"  # no open call for long: close the connection


@dataclass(frozen=True, slots=True)
class KeepaliveConfig:
    ping_after_s: float = 5.0
    timeout_s: float = 5.0
    idle_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        for name in ("ping_after_s", "timeout_s", "idle_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")


class Keepalive:
    """One connection's liveness. Tell it what arrived (``heard``, ``acked``); ``poll`` says what to do."""

    __slots__ = ("_busy_at", "_config", "_heard_at", "_ping_sent_at", "_pings", "_seq", "ping_payload")

    def __init__(self, config: KeepaliveConfig, now: float) -> None:
        self._config = config
        self._heard_at = now  # the last frame of any kind (or the start)
        self._busy_at = now  # the last poll that saw an open call
        self._ping_sent_at: float | None = None
        self._pings = 0  # pings since the last DATA/HEADERS received
        self._seq = 0
        self.ping_payload = b""

    def heard(self, now: float, *, data: bool) -> None:
        """Frames arrived; ``data``: among them DATA or HEADERS."""
        self._heard_at = now
        if data:
            self._pings = 0

    def acked(self, now: float, payload: bytes) -> None:
        """A PING ACK arrived (ours if ``payload`` matches; others are ignored)."""
        if self._ping_sent_at is not None and payload == self.ping_payload:
            self._ping_sent_at = None
            self._heard_at = now

    def poll(self, now: float, open_calls: int) -> tuple[KeepaliveAction, float]:
        """What to do now, and the time to poll again at the latest (``inf``: never; poll again when a call
        opens). After PING, send ``ping_payload``."""
        cfg = self._config
        if open_calls:
            self._busy_at = now
        if self._ping_sent_at is not None:
            deadline = self._ping_sent_at + cfg.timeout_s
            return (KeepaliveAction.DEAD, math.inf) if now >= deadline else (KeepaliveAction.NONE, deadline)
        if not open_calls:
            idle_at = self._busy_at + cfg.idle_timeout_s
            return (KeepaliveAction.IDLE, math.inf) if now >= idle_at else (KeepaliveAction.NONE, idle_at)
        if self._pings >= MAX_PINGS_WITHOUT_DATA:
            return KeepaliveAction.NONE, now + cfg.ping_after_s  # wait for data; look again later
        due = self._heard_at + cfg.ping_after_s * (1 << self._pings)
        if now < due:
            return KeepaliveAction.NONE, due
        self._seq += 1
        self.ping_payload = self._seq.to_bytes(8, "big")
        self._ping_sent_at = now
        self._pings += 1
        return KeepaliveAction.PING, now + cfg.timeout_s
