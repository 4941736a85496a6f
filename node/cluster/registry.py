"""The worker registry: which workers the cluster routes to. Cluster state, not a node's.

Entries live in the replicated registry table ``workers`` (``mesh.state``): any node adds or removes, the
latest write wins everywhere, and an entry outlives the node that wrote it. A worker's id is derived from
its URL, so the same ``--worker`` flag given to several nodes names one entry, and adding a worker twice
updates it in place.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal, get_args

from mesh.state import Change, ClusterState, Json
from node.config import parse_worker_url

WorkerRole = Literal["regular", "prefill", "decode"]
WORKER_ROLES: tuple[str, ...] = get_args(WorkerRole)
WORKERS_TABLE = "workers"
MAX_LABELS = 16
MAX_LABEL_BYTES = 128
MAX_MODEL_NAME_BYTES = 256


def worker_id(url: str) -> str:
    """A short stable id for a worker URL (the same on every node)."""
    return "w-" + hashlib.sha256(url.encode()).hexdigest()[:12]


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """What an operator registered: where the worker is and what it is for."""

    url: str
    model: str = ""  # empty: whatever the worker's GetModelInfo reports
    role: WorkerRole = "regular"
    labels: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Raises ValueError naming the bad field."""
        parse_worker_url(self.url)
        if self.role not in WORKER_ROLES:
            raise ValueError(f"role: must be one of {', '.join(WORKER_ROLES)}, got {self.role!r}")
        if len(self.model.encode()) > MAX_MODEL_NAME_BYTES:
            raise ValueError(f"model: at most {MAX_MODEL_NAME_BYTES} bytes")
        if len(self.labels) > MAX_LABELS:
            raise ValueError(f"labels: at most {MAX_LABELS}")
        for key, value in self.labels.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise ValueError("labels: keys and values must be strings")
            if not key or len(key.encode()) > MAX_LABEL_BYTES or len(value.encode()) > MAX_LABEL_BYTES:
                raise ValueError(f"labels: keys 1..{MAX_LABEL_BYTES} bytes, values at most {MAX_LABEL_BYTES}")

    @property
    def id(self) -> str:
        return worker_id(self.url)

    def to_json(self) -> dict[str, Json]:
        return {"url": self.url, "model": self.model, "role": self.role, "labels": dict(self.labels)}

    @classmethod
    def from_json(cls, value: Json) -> WorkerSpec | None:
        """The spec stored in an entry, or None if it is not one (a newer or broken peer's: ignored)."""
        if not isinstance(value, dict):
            return None
        url, model, role, labels = (
            value.get("url"),
            value.get("model", ""),
            value.get("role", "regular"),
            value.get("labels", {}),
        )
        if not isinstance(url, str) or not isinstance(model, str) or not isinstance(role, str):
            return None
        if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
            return None
        try:
            return cls(url=url, model=model, role=role, labels={str(k): str(v) for k, v in labels.items()})  # type: ignore[arg-type]
        except ValueError:
            return None


class WorkerRegistry:
    """The cluster's workers over one ClusterState. Call on the state's owner (the event loop) only."""

    def __init__(self, state: ClusterState, *, clock: Callable[[], float] = time.time) -> None:
        self._state = state
        self._clock = clock

    def add(self, spec: WorkerSpec) -> str:
        """Register (or update) ``spec``; returns its id."""
        self._state.add(WORKERS_TABLE, spec.id, spec.to_json(), self._clock())
        return spec.id

    def remove(self, wid: str) -> bool:
        """Unregister worker ``wid``; False if it is not registered."""
        if wid not in self._state.entries(WORKERS_TABLE):
            return False
        self._state.remove(WORKERS_TABLE, wid, self._clock())
        return True

    def specs(self) -> dict[str, WorkerSpec]:
        """Every registered worker by id (entries that do not parse are skipped)."""
        out: dict[str, WorkerSpec] = {}
        for wid, value in self._state.entries(WORKERS_TABLE).items():
            spec = WorkerSpec.from_json(value)
            if spec is not None and spec.id == wid:
                out[wid] = spec
        return out

    def subscribe(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback()`` after any change of the registry (local or remote). Returns unsubscribe."""

        def on_change(change: Change) -> None:
            if change.kind == "entry" and change.table == WORKERS_TABLE:
                callback()

        return self._state.subscribe(on_change)
