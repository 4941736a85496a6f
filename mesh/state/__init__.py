"""Replicated cluster state on pycrdt, carried by the mesh as its Delegate: the public API.

Everything an application needs is re-exported here; the modules beside it are internals (a test or a bench
may reach into them, an application should not). See mesh/README.md, "Cluster state".

    state = ClusterState("gw-1", StateConfig())
    async with Mesh(config, delegate=state) as mesh:
        ticker = asyncio.create_task(run_state(state, mesh, clock=time.time))
"""

from mesh.state.cluster_state import ClusterState
from mesh.state.config import StateConfig
from mesh.state.runner import LIVE_STATES, live_members, run_state
from mesh.state.values import Change, Json, Row, StateError, StateLimitError, StateMetrics

__all__ = [
    "LIVE_STATES",
    "Change",
    "ClusterState",
    "Json",
    "Row",
    "StateConfig",
    "StateError",
    "StateLimitError",
    "StateMetrics",
    "live_members",
    "run_state",
]
