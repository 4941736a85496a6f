"""Every bound of the replicated cluster state (``mesh.state``), each a named field with its reason.

Wire facts that every node must agree on (the version byte, message kinds, reserved names) are module
constants; what an operator may tune is a field of :class:`StateConfig`. Times are seconds on the clock
the node passes in as ``now`` (wall-clock seconds: the registry's hybrid logical clock compares them
across nodes).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Final, Self

from mesh.limits import MAX_USER_MSG_BYTES

#: First byte of every state message (delta broadcast or push-pull state; StateWireVersion in
#: proto/mesh_state.proto). Bump only for an incompatible change; within a version, message kinds are
#: append-only and protobuf fields may only be added. 1 was hand-written bodies; 2 is protobuf.
STATE_WIRE_VERSION: Final = 2

#: Table names: short identifiers that end up in every delta header.
MAX_TABLE_NAME_BYTES: Final = 64

#: Row tables may be split over at most this many documents (field-level sharding, see ``table_shards``).
MAX_TABLE_SHARDS: Final = 64

#: Registry entry keys: identifiers (worker ids, URLs), not documents.
MAX_ENTRY_KEY_BYTES: Final = 256

#: Counter keys (rate-limit keys): same order as entry keys.
MAX_COUNTER_KEY_BYTES: Final = 256

#: Rate-limit names ("rpm", "tokens-per-day"): part of every counter field, so short.
MAX_LIMIT_NAME_BYTES: Final = 32

#: Separates an entry key from its slot owner, and a counter's key, limit name and window, inside stored
#: keys. Forbidden in table names, node ids, entry keys, counter keys and limit names.
KEY_SEPARATOR: Final = "\x1f"

#: Reserved row table of the rate-limit counter shards (user table names may not start with "~").
COUNTER_TABLE: Final = "~counters"


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclass(frozen=True, slots=True)
class StateConfig:
    # -- sizes --
    max_row_bytes: int = field(
        default=16 * 1024,
        metadata=_help("largest stored value (one shard of a row, one registry entry) as JSON bytes"),
    )
    max_delta_bytes: int = field(
        default=MAX_USER_MSG_BYTES,
        metadata=_help("largest delta piggybacked on gossip; a larger one travels by push-pull only"),
    )
    max_doc_bytes: int = field(
        default=1024 * 1024,
        metadata=_help("a document whose encoded state exceeds this is compacted (rebuilt under a new epoch)"),
    )
    max_docs: int = field(
        default=256, metadata=_help("most documents (row-table shards + registries) held; more are refused")
    )
    max_pending_deltas: int = field(
        default=256, metadata=_help("deltas held while waiting for an earlier one of the same writer")
    )
    max_queued_deltas: int = field(
        default=1024,
        metadata=_help("deltas waiting to be gossiped; past it the most-sent are dropped (push-pull repairs)"),
    )
    max_seen_deltas: int = field(
        default=8192, metadata=_help("digests of recent deltas remembered to drop gossip duplicates")
    )

    max_counter_fields: int = field(
        default=2048,
        metadata=_help("most active rate-limit counters (key, limit, window) one node counts; more are refused"),
    )

    # -- sharding --
    # 16 counter shards of max_row_bytes hold max_counter_fields counters with short keys (~75 B each as
    # accounted, see counters.py) at about half full, so uneven hashing does not refuse early.
    counter_shards: int = field(
        default=16, metadata=_help("documents the rate-limit counters are spread over (by key hash)")
    )
    table_shards: tuple[tuple[str, int], ...] = field(
        default=(),
        metadata=_help("(table, shards) pairs: rows of these tables are split by field over that many docs"),
    )

    # -- time --
    tick_interval_s: float = field(
        default=0.25, metadata=_help("how often the owner calls tick(): counter flush and housekeeping cadence")
    )
    dead_gc_delay_s: float = field(
        default=300.0, metadata=_help("rows and shards of a node dead or left this long are deleted")
    )
    tombstone_ttl_s: float = field(
        default=86_400.0,
        metadata=_help("registry removals are remembered this long; must exceed the longest partition healed"),
    )
    housekeeping_interval_s: float = field(
        default=10.0,
        metadata=_help("how often tick() garbage-collects and measures document sizes (an encode of each)"),
    )

    # -- dissemination --
    retransmit_mult: int = field(
        default=4, metadata=_help("each delta is gossiped mult x ceil(log10(n + 1)) times by every node")
    )

    def __post_init__(self) -> None:
        positive = (
            "max_row_bytes",
            "max_delta_bytes",
            "max_doc_bytes",
            "max_docs",
            "max_pending_deltas",
            "max_seen_deltas",
            "max_queued_deltas",
            "max_counter_fields",
            "counter_shards",
            "tick_interval_s",
            "housekeeping_interval_s",
            "retransmit_mult",
        )
        for name in positive:
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: must be > 0, got {getattr(self, name)!r}")
        for name in ("dead_gc_delay_s", "tombstone_ttl_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0, got {getattr(self, name)!r}")
        if self.counter_shards > MAX_TABLE_SHARDS:
            raise ValueError(f"counter_shards: at most {MAX_TABLE_SHARDS}, got {self.counter_shards}")
        if self.max_doc_bytes < 4 * self.max_row_bytes:
            raise ValueError("max_doc_bytes: must hold at least 4 rows of max_row_bytes")
        for table, shards in self.table_shards:
            check_table_name(table)
            if not 1 <= shards <= MAX_TABLE_SHARDS:
                raise ValueError(f"table_shards[{table!r}]: must be in 1..{MAX_TABLE_SHARDS}, got {shards}")

    def shards_of(self, table: str) -> int:
        """How many documents rows of ``table`` are split over."""
        if table == COUNTER_TABLE:
            return self.counter_shards
        for name, shards in self.table_shards:
            if name == table:
                return shards
        return 1

    def with_(self, **overrides: Any) -> Self:
        """A copy with some fields replaced (validated again)."""
        return dataclasses.replace(self, **overrides)


def check_table_name(table: str) -> None:
    """Raises ValueError for an empty, oversized, reserved ("~...") or separator-bearing table name."""
    if not table or len(table.encode()) > MAX_TABLE_NAME_BYTES:
        raise ValueError(f"table name: 1..{MAX_TABLE_NAME_BYTES} bytes, got {table!r}")
    if table.startswith("~") or KEY_SEPARATOR in table or "/" in table:
        raise ValueError(f"table name: may not start with '~' or contain '/' or \\x1f: {table!r}")


def check_key(key: str, what: str, limit: int) -> None:
    """Raises ValueError for an empty, oversized or separator-bearing key."""
    if not key or len(key.encode()) > limit:
        raise ValueError(f"{what}: 1..{limit} bytes, got {key!r}")
    if KEY_SEPARATOR in key:
        raise ValueError(f"{what}: may not contain \\x1f: {key!r}")
