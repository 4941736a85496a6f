"""The thin asyncio shell of the cluster state: one owned task ticks it with the mesh's membership.

    async with Mesh(config, delegate=state) as mesh:
        ticker = asyncio.create_task(run_state(state, mesh, clock=time.time))   # owned by the supervisor
        ...
        ticker.cancel(); await asyncio.gather(ticker, return_exceptions=True)

Runs on the mesh's event loop, so the state's one owner stays one thread. ``clock`` is injected: wall
seconds (the registry's hybrid logical clock compares them across nodes).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from mesh.member import MemberState
from mesh.state.cluster_state import ClusterState

if TYPE_CHECKING:
    from mesh.runtime import Mesh

log = logging.getLogger(__name__)

#: Members that count as live for the state: a suspect may still be alive, and dropping its counter
#: shard from the sums on every false suspicion would over-admit.
LIVE_STATES = frozenset({MemberState.ALIVE, MemberState.SUSPECT})


def live_members(mesh: Mesh) -> list[str]:
    return mesh.member_names(LIVE_STATES)


async def run_state(state: ClusterState, mesh: Mesh, *, clock: Callable[[], float]) -> None:
    """Tick ``state`` every ``tick_interval_s`` until cancelled. A failing tick is logged, never fatal."""
    interval = state.config.tick_interval_s
    while True:
        try:
            state.tick(clock(), live_members(mesh))
        except Exception:
            log.exception("state: tick failed")
        await asyncio.sleep(interval)
