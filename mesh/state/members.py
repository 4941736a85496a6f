"""The cluster state's view of membership (pure): who is live, who has been gone how long, who is the
janitor. The node feeds it the mesh's live members at every ``tick``; nothing here reads a clock."""

from __future__ import annotations

from collections.abc import Collection


class MemberView:
    """Not thread-safe: owned by one ClusterState."""

    __slots__ = ("_alive", "_gone_since", "_synced", "node_id")

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        #: Live members as last reported (always including us); None until the first report.
        self._alive: frozenset[str] | None = None
        #: When we first saw each known node not live (on the node's clock).
        self._gone_since: dict[str, float] = {}
        #: Peers whose push-pull state we merged.
        self._synced: set[str] = set()

    @property
    def alive(self) -> frozenset[str] | None:
        return self._alive

    def update(self, now: float, alive: Collection[str], known: Collection[str], forget_after_s: float) -> None:
        """Take the live members; every other ``known`` node (owners of rows, slots, peers) is gone from
        ``now`` unless it already was. Gone nodes unknown for ``forget_after_s`` are forgotten."""
        self._alive = frozenset(alive) | {self.node_id}
        for node in self._alive:
            self._gone_since.pop(node, None)
        for node in set(known) - self._alive:
            self._gone_since.setdefault(node, now)
        for node, since in list(self._gone_since.items()):
            if now - since > forget_after_s and node not in known:
                del self._gone_since[node]

    def gone_for(self, now: float, delay_s: float) -> set[str]:
        """Nodes not live for at least ``delay_s``."""
        return {node for node, since in self._gone_since.items() if now - since >= delay_s}

    def is_janitor(self) -> bool:
        """Whether we are the live member with the smallest name (the one that garbage-collects)."""
        return self._alive is not None and min(self._alive) == self.node_id

    def is_live(self, node: str) -> bool:
        return self._alive is None or node in self._alive

    def peers(self) -> frozenset[str] | None:
        """Live members other than us, or None if membership was never reported."""
        return None if self._alive is None else self._alive - {self.node_id}

    def size(self) -> int:
        return len(self._alive) if self._alive is not None else len(self._synced) + 1

    # -- push-pull partners --

    def synced(self, node: str) -> None:
        self._synced.add(node)

    def synced_peers(self) -> frozenset[str]:
        if self._alive is None:
            return frozenset(self._synced)
        return frozenset(self._synced & self._alive)

    def known_synced(self) -> set[str]:
        return set(self._synced)

    def forget(self, nodes: Collection[str]) -> None:
        self._synced.difference_update(nodes)
