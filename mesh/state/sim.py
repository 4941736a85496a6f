"""The cluster state over the simulated mesh (``mesh.sim``): real SWIM cores, virtual time, no sockets.

Each simulated member gets a :class:`ClusterState` as its delegate; ``run_for`` advances the network and
ticks every live state every ``tick_interval_s`` with the membership its own core sees — what
``runner.run_state`` does on a real event loop. Shared by the tests and ``bench/state_bench.py``.
"""

from __future__ import annotations

from mesh.config import MeshConfig
from mesh.member import MemberState
from mesh.sim import Link, SimNetwork, SimNode
from mesh.state.cluster_state import ClusterState
from mesh.state.config import StateConfig

#: Virtual time 0 is this wall-clock second (HLC timestamps then look like real ones).
WALL_EPOCH_S = 1_700_000_000.0

_LIVE = (MemberState.ALIVE, MemberState.SUSPECT)


class StateSim:
    def __init__(
        self,
        n: int,
        *,
        seed: int,
        mesh_config: MeshConfig | None = None,
        state_config: StateConfig | None = None,
        link: Link | None = None,
    ) -> None:
        self.net = SimNetwork(seed, link=link)
        self.mesh_config = mesh_config or MeshConfig.lan()
        self.state_config = state_config or StateConfig()
        self.states: dict[str, ClusterState] = {}
        self.sim_nodes: dict[str, SimNode] = {}
        self._next_tick = 0.0
        seed_node = self.add("s0", join=False)
        for i in range(1, n):
            self.net.run_for(0.05)
            self.add(f"s{i}", seeds=[seed_node])

    @property
    def wall(self) -> float:
        return WALL_EPOCH_S + self.net.now

    def add(self, name: str, *, join: bool = True, seeds: list[str] | None = None) -> str:
        """A new member with a fresh state, joining through ``seeds`` (default: the first member)."""
        state = ClusterState(name, self.state_config)
        node = self.net.add_node(self.mesh_config, name, delegate=state)
        self.states[name] = state
        self.sim_nodes[name] = node
        if join:
            self.net.join(node, [self.sim_nodes[s] for s in (seeds or ["s0"])])
        return name

    def crash(self, name: str) -> None:
        self.net.crash(self.sim_nodes[name])

    def live(self) -> list[str]:
        return [name for name, node in self.sim_nodes.items() if node.live]

    def alive_view(self, name: str) -> list[str]:
        return [m.name for m in self.sim_nodes[name].swim.members() if m.state in _LIVE]

    def run_for(self, seconds: float) -> None:
        end = self.net.now + seconds
        interval = self.state_config.tick_interval_s
        while self.net.now < end:
            self.net.run_until(min(end, max(self._next_tick, self.net.now)))
            if self.net.now >= self._next_tick:
                self._next_tick = self.net.now + interval
                for name in self.live():
                    self.states[name].tick(self.wall, self.alive_view(name))

    def bytes_out(self, name: str) -> int:
        return self.sim_nodes[name].swim.metrics().bytes_out
