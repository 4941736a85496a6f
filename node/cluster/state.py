"""The node's share of the replicated cluster state: the worker registry, the API keys, health observations
and routing hints, carried by the mesh (or kept locally when the node runs alone).

One ``ClusterState`` per node process, named like its mesh member so membership and state agree on who is
alive. The mesh's single delegate slot is split into channels (``mesh.channels``): the replicated state on
one, best-effort routing hints on the second, and on a third the recent hints a joining node is handed in the
join push-pull (``node.cluster.hint_snapshot``). A ticker task drives the state's clocked work (counter flush,
garbage collection) with the mesh's view of live members (as ``mesh.state.run_state`` does for a bare state),
plus the health board's publishing and the routing hints' sending.

Without a mesh the same code runs on a standalone state: one code path, and a node that later joins a
cluster (``smg-node join``) brings its workers with it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from mesh import MAX_CHANNEL_MSG_BYTES, BestEffortBroadcast, Channels
from mesh.state import ClusterState, StateConfig, live_members
from node.cluster.api_keys import ApiKeyTable
from node.cluster.health import HEALTH_SHARDS, HEALTH_TABLE, HealthBoard
from node.cluster.hint_snapshot import HintSnapshot
from node.cluster.limiter import INFLIGHT_SHARDS, INFLIGHT_TABLE, ClusterLimiter
from node.cluster.registry import WorkerRegistry
from node.cluster.tenant_limits import TenantLimits

if TYPE_CHECKING:
    from mesh import Mesh

log = logging.getLogger(__name__)

#: Channel ids on the mesh delegate; every node must agree (append-only).
STATE_CHANNEL = 1
HINTS_CHANNEL = 2
HINT_SNAPSHOT_CHANNEL = 3
#: The state's name when the node runs without a mesh.
STANDALONE_NODE = "local"
#: A routing-hint message rides one channel message (the hints' publisher packs to this size).
HINT_MAX_MESSAGE_BYTES = MAX_CHANNEL_MSG_BYTES


def mesh_delegate() -> Channels:
    """The mesh's one delegate: channels that ``open_shared_state`` fills (state, hints, hint snapshot)."""
    return Channels()


def state_config() -> StateConfig:
    """The node's StateConfig: deltas fit a channel message; health rows are sharded by worker."""
    return StateConfig(
        max_delta_bytes=MAX_CHANNEL_MSG_BYTES,
        table_shards=((HEALTH_TABLE, HEALTH_SHARDS), (INFLIGHT_TABLE, INFLIGHT_SHARDS)),
    )


@dataclass(slots=True)
class SharedState:
    state: ClusterState
    registry: WorkerRegistry
    board: HealthBoard
    hints: BestEffortBroadcast
    hint_snapshot: HintSnapshot
    mesh: Mesh | None
    keys: ApiKeyTable
    limiter: ClusterLimiter
    tenant_limits: TenantLimits

    def alive_members(self) -> list[str] | None:
        return live_members(self.mesh) if self.mesh is not None else None

    def tick(self) -> None:
        self.limiter.tick()
        self.state.tick(time.time(), self.alive_members())
        self.board.tick()


def open_shared_state(
    *,
    mesh: Mesh | None,
    channels: Channels | None,
    health_publish_interval_s: float,
    on_hints: Callable[[bytes], None],
) -> SharedState:
    """Create the node's state and plug it into ``channels`` (the mesh's delegate) when there is a mesh."""
    state = ClusterState(mesh.name if mesh is not None else STANDALONE_NODE, state_config())

    def cluster_size() -> int:
        return mesh.size if mesh is not None else 1

    snapshot = HintSnapshot(on_hints)

    def received(msg: bytes) -> None:
        snapshot.record(msg)
        on_hints(msg)

    hints = BestEffortBroadcast(received, retransmit_mult=state.config.retransmit_mult, cluster_size=cluster_size)
    if channels is not None:
        channels.attach(STATE_CHANNEL, state)
        channels.attach(HINTS_CHANNEL, hints)
        channels.attach(HINT_SNAPSHOT_CHANNEL, snapshot)
    board = HealthBoard(state, publish_interval_s=health_publish_interval_s)

    def alive() -> list[str] | None:
        return live_members(mesh) if mesh is not None else None

    return SharedState(
        state=state,
        registry=WorkerRegistry(state),
        board=board,
        hints=hints,
        hint_snapshot=snapshot,
        mesh=mesh,
        keys=ApiKeyTable(state),
        limiter=ClusterLimiter(state, alive=alive),
        tenant_limits=TenantLimits(state),
    )


class HintSource(Protocol):
    def take_outgoing(self) -> list[bytes]: ...


async def run_ticker(shared: SharedState, hints: HintSource | None = None) -> None:
    """Tick the shared state forever, and send the routing hints gathered since the last tick (a
    supervised background task)."""
    interval = shared.state.config.tick_interval_s
    while True:
        try:
            shared.tick()
            if hints is not None and shared.mesh is not None:
                for msg in hints.take_outgoing():
                    if shared.hints.publish(msg):
                        shared.hint_snapshot.record(msg)
        except Exception:  # a bug in housekeeping must not stop replication
            log.exception("cluster state tick failed")
        await asyncio.sleep(interval)
