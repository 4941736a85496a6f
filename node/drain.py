"""Graceful drain: what a node does between SIGTERM and its exit.

The order is what lets a load balancer and the mesh take the node out before it goes: readiness answers 503 at
once (active health checks see it); the node starts leaving the mesh (peers see LEFT, not a failure) and, at
the same moment, closes its HTTP listener (new connections are refused, so a proxy retries them elsewhere;
not after the leave, which can take the mesh's whole leave timeout when nobody is left to hear it); the
requests and streams in flight finish, bounded by ``drain_timeout_s``; the leave is awaited before the mesh
stops; then the process exits 0.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)


class Drain:
    """The node's draining flag, set once and never cleared (a draining node only exits), and its departure
    from the mesh, which runs alongside the rest of the drain."""

    __slots__ = ("_leaving", "_since")

    def __init__(self) -> None:
        self._since: float | None = None
        self._leaving: asyncio.Task[None] | None = None

    @property
    def draining(self) -> bool:
        return self._since is not None

    def start(self, reason: str = "shutting down", *, leave: Callable[[], Awaitable[None]] | None = None) -> None:
        """Flip readiness to 503 and start ``leave`` (the mesh leave) in the background. Idempotent."""
        if self._since is not None:
            return
        self._since = time.monotonic()
        log.info("draining (%s): readiness is 503 from now on", reason)
        if leave is not None:

            async def leaving() -> None:
                await leave()

            self._leaving = asyncio.create_task(leaving(), name="mesh-leave")

    async def left(self) -> None:
        """Wait for the leave started by ``start`` (if any) to finish; its failures are the callable's to log."""
        if self._leaving is not None:
            await asyncio.gather(self._leaving, return_exceptions=True)
