"""Worker health as the cluster sees it: every node publishes what it observed, verdicts merge them.

Each node health-checks the workers it can reach and publishes its observations as its row of the
replicated table ``health`` (``mesh.state``; one field per worker, sharded so a flip travels as one small
delta). The cluster verdict on a worker merges the rows of *live* nodes: it is in if any live node sees it
healthy. So one node's broken link does not take a worker out for everybody, and a worker nobody can reach
is out as soon as each node's own checks say so (``health_failures_to_unhealthy`` checks) and the flips
spread (one gossip round).

Whether *this* node routes to a worker: its own verdict once it has one (a worker we cannot reach is useless
to us, whatever others see), else the cluster's (a node that just joined routes at once on what the
cluster knows).

Publishing: a verdict flip is published at once; load-only changes at most every ``publish_interval_s``
(loads are each node's own view for routing; others only display them).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from mesh.state import Change, ClusterState, Json

HEALTH_TABLE = "health"
#: The health row is split by worker over this many documents, so a flip rewrites one small shard.
HEALTH_SHARDS = 64
#: Error texts are cut to this many characters in the shared row.
MAX_ERROR_CHARS = 120


@dataclass(frozen=True, slots=True)
class Observation:
    """One node's view of one worker."""

    ok: bool
    since_s: float  # wall-clock time of the last verdict flip
    running: int = 0
    waiting: int = 0
    token_usage: float = 0.0
    error: str = ""

    def to_json(self) -> Json:
        return [
            1 if self.ok else 0,
            round(self.since_s, 3),
            self.running,
            self.waiting,
            round(self.token_usage, 3),
            self.error[:MAX_ERROR_CHARS],
        ]

    @classmethod
    def from_json(cls, value: Json) -> Observation | None:
        if not isinstance(value, list) or len(value) < 6:
            return None
        ok, since, running, waiting, usage, error = value[:6]
        if not all(isinstance(v, int | float) for v in (ok, since, running, waiting, usage)) or not isinstance(
            error, str
        ):
            return None
        return cls(bool(ok), float(since), int(running), int(waiting), float(usage), error)  # type: ignore[arg-type]


class HealthBoard:
    """Own observations out, merged verdicts in. Call on the state's owner (the event loop) only."""

    def __init__(
        self, state: ClusterState, *, publish_interval_s: float, clock: Callable[[], float] = time.time
    ) -> None:
        self._state = state
        self._interval = publish_interval_s
        self._clock = clock
        self._own: dict[str, Observation] = {}
        self._published: dict[str, Observation] = {}
        self._next_publish = 0.0
        self._verdicts: dict[str, bool] | None = None  # cache of cluster verdicts; None: recompute
        state.subscribe(self._on_change)

    @property
    def node(self) -> str:
        return self._state.node_id

    def observe(
        self, wid: str, ok: bool, *, running: int = 0, waiting: int = 0, token_usage: float = 0.0, error: str = ""
    ) -> None:
        """Record this node's latest check of ``wid``; a verdict flip is published at once."""
        prev = self._own.get(wid)
        since = prev.since_s if prev is not None and prev.ok == ok else self._clock()
        self._own[wid] = Observation(ok, since, running, waiting, token_usage, "" if ok else error)
        published = self._published.get(wid)
        if published is None or published.ok != ok:
            self.publish()

    def forget(self, wid: str) -> None:
        """``wid`` was unregistered: stop publishing about it."""
        if self._own.pop(wid, None) is not None:
            self.publish()

    def tick(self) -> None:
        """Call periodically: publishes load changes at most every ``publish_interval_s``; picks up
        membership changes (a dead node's observations stop counting)."""
        self._verdicts = None
        now = self._clock()
        if now >= self._next_publish and self._own != self._published:
            self.publish()

    def publish(self) -> None:
        self._state.set_row(HEALTH_TABLE, {wid: obs.to_json() for wid, obs in self._own.items()})
        self._published = dict(self._own)
        self._next_publish = self._clock() + self._interval

    def observations(self, wid: str) -> dict[str, Observation]:
        """Every live node's observation of ``wid`` (ours included), by node."""
        out: dict[str, Observation] = {}
        for node, row in self._state.rows(HEALTH_TABLE, live_only=True).items():
            obs = Observation.from_json(row.get(wid)) if wid in row else None
            if obs is not None:
                out[node] = obs
        own = self._own.get(wid)
        if own is not None:
            out[self.node] = own
        return out

    def cluster_ok(self, wid: str) -> bool | None:
        """True if some live node sees ``wid`` healthy, False if all that observed it see it failing,
        None if nobody has observed it yet."""
        if self._verdicts is None:
            self._verdicts = self._merge(self._state.rows(HEALTH_TABLE, live_only=True))
        own = self._own.get(wid)
        if own is not None and own.ok:
            return True
        return self._verdicts.get(wid, None if own is None else False)

    def routable(self, wid: str) -> bool:
        own = self._own.get(wid)
        if own is not None:
            return own.ok
        return self.cluster_ok(wid) is True

    def _merge(self, rows: Mapping[str, Mapping[str, Json]]) -> dict[str, bool]:
        verdicts: dict[str, bool] = {}
        for node, row in rows.items():
            if node == self.node:
                continue  # our own current view is in _own (fresher than what we published)
            for wid, value in row.items():
                obs = Observation.from_json(value)
                if obs is not None:
                    verdicts[wid] = verdicts.get(wid, False) or obs.ok
        for wid, obs in self._own.items():
            verdicts[wid] = verdicts.get(wid, False) or obs.ok
        return verdicts

    def _on_change(self, change: Change) -> None:
        if change.table == HEALTH_TABLE:
            self._verdicts = None
