"""Values and errors of the replicated cluster state's API."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, TypeAlias

from mesh.errors import MeshError

#: A JSON value. Rows and registry values are stored as JSON text, so ints stay exact at any size.
Json: TypeAlias = bool | int | float | str | list["Json"] | dict[str, "Json"] | None

#: One node's row in a table: a small JSON-able mapping, written whole by its owner.
Row: TypeAlias = Mapping[str, Json]


class StateError(MeshError):
    """Base of the errors the cluster state raises for misuse of its API."""


class StateLimitError(StateError, ValueError):
    """A value, key or table exceeds a configured bound (the named bound is in the message)."""


@dataclass(frozen=True, slots=True)
class Change:
    """What changed, as subscribers see it.

    ``kind`` is "row" (``key`` is the owner node) or "entry" (a registry ``key``). ``value`` is the new
    value (None: removed), ``previous`` the old one (None: added). ``local``: our own write (including
    the automatic re-assertion of our own rows), as opposed to one learned from a peer.
    """

    kind: Literal["row", "entry"]
    table: str
    key: str
    value: Json
    previous: Json
    local: bool


@dataclass(frozen=True, slots=True)
class StateMetrics:
    """Counters since start, plus current sizes. Bytes are delta payloads and push-pull states."""

    deltas_out: int
    deltas_oversized: int
    deltas_dropped: int
    deltas_in: int
    deltas_applied: int
    deltas_duplicate: int
    deltas_held: int
    deltas_stale: int
    malformed: int
    states_out_full: int
    states_out_diff: int
    states_in: int
    state_bytes_out: int
    compactions: int
    adoptions: int
    counters_refused: int
    counter_flush_failures: int
    docs: int
    doc_bytes: int


def dumps(value: Json) -> str:
    """Canonical JSON text (sorted keys, no spaces): equal values encode to equal strings."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
