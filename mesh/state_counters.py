"""Cluster-wide rate-limit counters: per (key, window) one shard per node, summed over live nodes.

Each node counts its own admissions in ``(key, window)`` for the current window epoch
``floor(now / window)`` and publishes them in its own row of the reserved ``~counters`` table (sharded
by field over ``counter_shards`` documents so one key's update is a small delta). Counts are JSON
*strings* (never pycrdt numbers, which are float64); epochs are JSON ints inside the row text.

* Merge of two versions of one node's shard (its previous life's, seen after a restart): per key the
  higher epoch wins, then the larger count.
* Global value: the sum, over live nodes, of their shard's count if its epoch is the current one. Our
  own count is read from memory (exact); peers' are as of their last flush plus propagation.
* Expired windows (epoch < the current one) are dropped from our row at the next flush; a dead node's
  whole row is deleted by the janitor after ``dead_gc_delay_s`` (and ignored at once: not live).

**Over-admission bound.** A node admits while the sum it sees is below the limit. What it cannot see is
each peer's admissions since that peer's last flush (every ``tick_interval_s``) plus the propagation
delay ``d`` (a few gossip intervals; a push-pull interval if a delta is lost). With ``N`` nodes each
admitting at rate ``r``, a window admits at most ``limit + (N - 1) * r * (tick_interval_s + d)``. Two
more slack sources: the admissions of a node that dies mid-window leave the sum (up to its count), and
a node that has not yet heard from the others sees only its own count — the caller should grant each
node ``limit / N`` until ``ClusterState.synced_peers()`` covers the live members.
"""

from __future__ import annotations

from collections.abc import Callable

from mesh.state_config import COUNTER_TABLE, KEY_SEPARATOR, MAX_COUNTER_KEY_BYTES, StateConfig, check_key
from mesh.state_rows import RowTables, field_shard
from mesh.state_types import Json, Row


def window_ms(window_s: float) -> int:
    """Raises ValueError for a window under a millisecond."""
    ms = round(window_s * 1000)
    if ms < 1:
        raise ValueError(f"window_s: must be >= 0.001, got {window_s!r}")
    return ms


def epoch_of(now: float, window: int) -> int:
    return int(now * 1000) // window


def _parse(value: Json) -> tuple[int, int] | None:
    """(epoch, count) of a stored counter, or None if malformed."""
    if not isinstance(value, list) or len(value) != 2:
        return None
    epoch, count = value
    if not isinstance(epoch, int) or not isinstance(count, str) or not count.isdigit():
        return None
    return epoch, int(count)


class Counters:
    """Not thread-safe: owned by one ClusterState."""

    __slots__ = ("_config", "_dirty", "_mine", "_node", "_rows")

    def __init__(self, node_id: str, config: StateConfig, rows: RowTables) -> None:
        self._node = node_id
        self._config = config
        self._rows = rows
        #: field ("key\x1fwindow_ms") -> (epoch, count): our own shard, the truth for our admissions.
        self._mine: dict[str, tuple[int, int]] = {}
        self._dirty = False
        rows.set_adopter(COUNTER_TABLE, self._adopt)

    def incr(self, key: str, window_s: float, now: float, amount: int, live: Callable[[str], bool]) -> int:
        """Count ``amount`` admissions now; returns the global count of the current window. Raises
        ValueError for a bad key, window or a negative amount."""
        if amount < 0:
            raise ValueError(f"amount: must be >= 0, got {amount}")
        check_key(key, "counter key", MAX_COUNTER_KEY_BYTES)
        window = window_ms(window_s)
        field = f"{key}{KEY_SEPARATOR}{window}"
        epoch = epoch_of(now, window)
        stored = self._mine.get(field)
        if stored is None or stored[0] < epoch:
            self._mine[field] = (epoch, amount)
            self._dirty = True
        elif stored[0] == epoch and amount:
            self._mine[field] = (epoch, stored[1] + amount)
            self._dirty = True
        # (stored epoch > now's: our clock went back; that newer window keeps its count.)
        return self.count(key, window_s, now, live)

    def count(self, key: str, window_s: float, now: float, live: Callable[[str], bool]) -> int:
        """The global count of ``key`` in the current window: ours plus every live peer's."""
        window = window_ms(window_s)
        field = f"{key}{KEY_SEPARATOR}{window}"
        epoch = epoch_of(now, window)
        mine = self._mine.get(field)
        total = mine[1] if mine is not None and mine[0] == epoch else 0
        index = field_shard(field, self._config.counter_shards)
        for owner, shard in self._rows.shard(COUNTER_TABLE, index).items():
            if owner == self._node or not live(owner):
                continue
            parsed = _parse(shard.get(field))
            if parsed is not None and parsed[0] == epoch:
                total += parsed[1]
        return total

    def flush(self, now: float) -> None:
        """Drop expired windows from our shard and publish it if it changed since the last flush."""
        for field, (epoch, _) in list(self._mine.items()):
            window = int(field.rsplit(KEY_SEPARATOR, 1)[1])
            if epoch < epoch_of(now, window):
                del self._mine[field]
                self._dirty = True
        if self._dirty:
            self._dirty = False
            self._rows.set_row(COUNTER_TABLE, self._encoded())

    def _encoded(self) -> Row:
        return {field: [epoch, str(count)] for field, (epoch, count) in self._mine.items()}

    def _adopt(self, observed: Row) -> Row:
        """A version of our own shard from a peer (our previous life's): keep the max per key."""
        for field, value in observed.items():
            parsed = _parse(value)
            if parsed is None or KEY_SEPARATOR not in field:
                continue
            mine = self._mine.get(field)
            if mine is None or parsed > mine:
                self._mine[field] = parsed
        return self._encoded()


def describe(row: Row) -> dict[str, tuple[int, int]]:
    """A counter row decoded (for tests and debugging)."""
    out = {}
    for field, value in row.items():
        parsed = _parse(value)
        if parsed is not None:
            out[field] = parsed
    return out
