"""Graceful drain: what a node does between SIGTERM and its exit.

The order is what lets a load balancer and the mesh take the node out before it goes: readiness answers 503 at
once (active health checks see it), the node leaves the mesh (peers see LEFT, not a failure, and stop routing
hints to it), then the HTTP listener closes (new connections are refused, so a proxy retries them elsewhere),
and the requests and streams in flight finish, bounded by ``drain_timeout_s``; then the process exits 0.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger(__name__)


class Drain:
    """The node's draining flag, set once and never cleared (a draining node only exits)."""

    __slots__ = ("_since",)

    def __init__(self) -> None:
        self._since: float | None = None

    @property
    def draining(self) -> bool:
        return self._since is not None

    def start(self, reason: str = "shutting down") -> None:
        if self._since is None:
            self._since = time.monotonic()
            log.info("draining (%s): readiness is 503 from now on", reason)
