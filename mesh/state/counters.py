"""Cluster-wide rate-limit counters: per (key, limit, window) one shard per node, summed over live nodes.

Each node counts its own admissions of a *counter* — a (key, limit name, window) triple, e.g. ("tenant-a",
"rpm", 60 s) — for the current window epoch ``floor(now / window)`` and publishes them in its own row of
the reserved ``~counters`` table (sharded by field over ``counter_shards`` documents so one key's update
is a small delta). A field is ``key \\x1f limit \\x1f window_ms`` (the limit is a short name, not its
numeric value: changing a limit's maximum keeps its count). Counts are JSON *strings* (never pycrdt
numbers, which are float64); epochs are JSON ints inside the row text.

* Merge of two versions of one node's shard (its previous life's, seen after a restart): per field the
  higher epoch wins, then the larger count.
* Global value: the sum, over live nodes, of their shard's count if its epoch is the current one. Our
  own count is read from memory (exact); peers' are as of their last flush plus propagation.
* Expired windows (epoch < the current one) are dropped from our row at the next flush; a dead node's
  whole row is deleted by the janitor after ``dead_gc_delay_s`` (and ignored at once: not live).

**Capacity.** A node's counters are one value per counter document (the single-writer layout that keeps
Yrs documents from growing), so what one node can hold is bounded by ``counter_shards x max_row_bytes``
whatever the sharding; past it the row could not be published at all. So ``incr`` refuses, with a
StateLimitError and the ``counters_refused`` metric, a *new* counter past ``max_counter_fields`` active
ones, or one whose shard would pass ``max_row_bytes`` (each field is accounted with room for a 20-digit
count and a 15-digit epoch, so counters already admitted keep counting; a count past 10**20 in one
window is accounted at its real size and refused if it does not fit). Why refuse rather than drop or
evict: a rate limiter must never under-count silently — an evicted or unpublished counter lets every
node admit a full limit again. An explicit error lets the caller choose its policy (fail closed, or fall
back to a local limit / N); the counters already admitted stay exact, and a slot frees when its window
expires (at the next flush).

**Over-admission bound.** A node admits while the sum it sees is below the limit. What it cannot see is
each peer's admissions since that peer's last flush (every ``tick_interval_s``) plus the propagation
delay ``d`` (at most log2 N + 3 gossip intervals while the node's counter shard fits one delta of
``max_delta_bytes``; a push-pull interval if a delta is lost or too big). With ``N`` nodes each
admitting at rate ``r``, a window admits at most ``limit + (N - 1) * r * (tick_interval_s + d)``
(tests/mesh/test_state_admission.py: 5 simulated members at 40 requests/s each against a limit of 200
admit 219-248 on the LAN profile and 330-507 with 1 s gossip and 2 s flushes over 8 seeds; bounds 412
and 1,372). Two more slack sources: the admissions of a node that dies mid-window leave the sum (up to
its count), and a node that has not yet heard from the others sees only its own count — the caller
should grant each node ``limit / N`` until ``ClusterState.synced_peers()`` covers the live members.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from mesh.state.config import (
    COUNTER_TABLE,
    KEY_SEPARATOR,
    MAX_COUNTER_KEY_BYTES,
    MAX_LIMIT_NAME_BYTES,
    StateConfig,
    check_key,
)
from mesh.state.rows import RowTables, field_shard
from mesh.state.values import Json, Row, StateLimitError, dumps

#: Digits reserved per field for its count and epoch when accounting a shard's size: a counter admitted
#: once keeps counting up to 10**20 - 1 per window, and epochs of 1 ms windows fit 15 digits until the
#: year 33,000, without its shard outgrowing ``max_row_bytes``.
COUNT_DIGITS_RESERVED: Final = 20
EPOCH_DIGITS_RESERVED: Final = 15
#: ``"field":[epoch,"count"],`` less the field's and numbers' own characters.
_FIELD_OVERHEAD: Final = 7
#: ``{}`` around a shard's fields.
_SHARD_OVERHEAD: Final = 2
_COUNT_FLOOR: Final = 10**COUNT_DIGITS_RESERVED
_EPOCH_FLOOR: Final = 10 ** (EPOCH_DIGITS_RESERVED - 1)


def window_ms(window_s: float) -> int:
    """Raises ValueError for a window under a millisecond."""
    ms = round(window_s * 1000)
    if ms < 1:
        raise ValueError(f"window_s: must be >= 0.001, got {window_s!r}")
    return ms


def epoch_of(now: float, window: int) -> int:
    return int(now * 1000) // window


def counter_field(key: str, limit: str, window: int) -> str:
    """The stored field of a counter (``window`` in ms)."""
    return f"{key}{KEY_SEPARATOR}{limit}{KEY_SEPARATOR}{window}"


def parse_field(field: str) -> tuple[str, str, int] | None:
    """(key, limit, window_ms) of a stored field, or None if it is not one."""
    parts = field.split(KEY_SEPARATOR)
    if len(parts) != 3 or not parts[2].isdigit() or int(parts[2]) < 1:
        return None
    return parts[0], parts[1], int(parts[2])


def _parse(value: Json) -> tuple[int, int] | None:
    """(epoch, count) of a stored counter, or None if malformed."""
    if not isinstance(value, list) or len(value) != 2:
        return None
    epoch, count = value
    if not isinstance(epoch, int) or not isinstance(count, str) or not count.isdigit():
        return None
    return epoch, int(count)


@dataclass(slots=True)
class _Slot:
    """One of our own counters: the truth for our admissions."""

    window: int
    shard: int
    #: The field's JSON bytes (it never changes) and what the field is accounted at in its shard.
    name_bytes: int
    epoch: int
    count: int
    cost: int


def _cost(name_bytes: int, epoch: int, count: int) -> int:
    epoch_digits = EPOCH_DIGITS_RESERVED if -_EPOCH_FLOOR < epoch < _EPOCH_FLOOR else len(str(epoch))
    count_digits = COUNT_DIGITS_RESERVED if count < _COUNT_FLOOR else len(str(count))
    return name_bytes + epoch_digits + count_digits + _FIELD_OVERHEAD


class Counters:
    """Not thread-safe: owned by one ClusterState."""

    __slots__ = ("_config", "_dirty", "_mine", "_node", "_rows", "_shard_bytes", "refused")

    def __init__(self, node_id: str, config: StateConfig, rows: RowTables) -> None:
        self._node = node_id
        self._config = config
        self._rows = rows
        self._mine: dict[str, _Slot] = {}
        #: Accounted JSON bytes of each shard of our row (an upper bound of what flush writes).
        self._shard_bytes = [_SHARD_OVERHEAD] * config.counter_shards
        self._dirty = False
        #: incr calls refused for capacity (the ``counters_refused`` metric).
        self.refused = 0
        rows.set_adopter(COUNTER_TABLE, self._adopt)

    def incr(
        self, key: str, limit: str, window_s: float, now: float, amount: int, *, live: Callable[[str], bool]
    ) -> int:
        """Count ``amount`` admissions now; returns the global count of the current window. Raises
        ValueError for a bad key, limit name, window or a negative amount; StateLimitError (counted)
        for a new counter past ``max_counter_fields`` or one its shard has no room for."""
        if amount < 0:
            raise ValueError(f"amount: must be >= 0, got {amount}")
        check_key(key, "counter key", MAX_COUNTER_KEY_BYTES)
        check_key(limit, "limit name", MAX_LIMIT_NAME_BYTES)
        window = window_ms(window_s)
        field = counter_field(key, limit, window)
        epoch = epoch_of(now, window)
        slot = self._mine.get(field)
        if slot is None:
            self._add(field, window, epoch, amount)
        elif slot.epoch < epoch:
            self._set(field, slot, epoch, amount)
        elif slot.epoch == epoch and amount:
            self._set(field, slot, epoch, slot.count + amount)
        # (stored epoch > now's: our clock went back; that newer window keeps its count.)
        return self._total(field, epoch, live)

    def count(self, key: str, limit: str, window_s: float, now: float, live: Callable[[str], bool]) -> int:
        """The global count of a counter in the current window: ours plus every live peer's."""
        window = window_ms(window_s)
        return self._total(counter_field(key, limit, window), epoch_of(now, window), live)

    def _total(self, field: str, epoch: int, live: Callable[[str], bool]) -> int:
        mine = self._mine.get(field)
        total = mine.count if mine is not None and mine.epoch == epoch else 0
        index = field_shard(field, self._config.counter_shards)
        for owner, shard in self._rows.shard(COUNTER_TABLE, index).items():
            if owner == self._node or not live(owner):
                continue
            parsed = _parse(shard.get(field))
            if parsed is not None and parsed[0] == epoch:
                total += parsed[1]
        return total

    def _add(self, field: str, window: int, epoch: int, count: int) -> None:
        """Raises StateLimitError (counted) if the new counter does not fit."""
        limit = self._config.max_counter_fields
        if len(self._mine) >= limit:
            self.refused += 1
            raise StateLimitError(f"counter {field!r}: this node already counts max_counter_fields={limit}")
        slot = self._slot(field, window, epoch, count)
        self._reserve(field, slot.shard, slot.cost)
        self._mine[field] = slot
        self._dirty = True

    def _slot(self, field: str, window: int, epoch: int, count: int) -> _Slot:
        name_bytes = len(dumps(field).encode())
        shard = field_shard(field, self._config.counter_shards)
        return _Slot(window, shard, name_bytes, epoch, count, _cost(name_bytes, epoch, count))

    def _set(self, field: str, slot: _Slot, epoch: int, count: int, *, bounded: bool = True) -> None:
        """Raises StateLimitError (counted) if ``bounded`` and a count or epoch past its reserved digits
        does not fit."""
        cost = _cost(slot.name_bytes, epoch, count)
        if bounded and cost > slot.cost:
            self._reserve(field, slot.shard, cost - slot.cost)
        else:
            self._shard_bytes[slot.shard] += cost - slot.cost
        slot.epoch, slot.count, slot.cost = epoch, count, cost
        self._dirty = True

    def _reserve(self, field: str, shard: int, extra: int) -> None:
        if self._shard_bytes[shard] + extra > self._config.max_row_bytes:
            self.refused += 1
            raise StateLimitError(
                f"counter {field!r}: its shard {shard} of {self._config.counter_shards} (counter_shards) would "
                f"pass max_row_bytes={self._config.max_row_bytes}"
            )
        self._shard_bytes[shard] += extra

    def flush(self, now: float) -> None:
        """Drop expired windows from our shard and publish it if it changed since the last flush. Raises
        StateLimitError if a shard exceeds max_row_bytes (only a previous life's counters adopted under
        larger bounds can: ``incr`` keeps within them); it stays unpublished until they expire."""
        epochs: dict[int, int] = {}
        for field, slot in list(self._mine.items()):
            current = epochs.get(slot.window)
            if current is None:
                current = epochs[slot.window] = epoch_of(now, slot.window)
            if slot.epoch < current:
                del self._mine[field]
                self._shard_bytes[slot.shard] -= slot.cost
                self._dirty = True
        if self._dirty:
            self._rows.set_row(COUNTER_TABLE, self._encoded())
            self._dirty = False

    def _encoded(self) -> Row:
        return {field: [slot.epoch, str(slot.count)] for field, slot in self._mine.items()}

    def _adopt(self, observed: Row) -> None:
        """A version of our own shard from a peer (our previous life's): keep the max per field, past the
        capacity bounds if need be (dropping would under-count); published at the next flush."""
        for field, value in observed.items():
            parsed = _parse(value)
            shape = parse_field(field)
            if parsed is None or shape is None:
                continue
            epoch, count = parsed
            slot = self._mine.get(field)
            if slot is None:
                slot = self._mine[field] = self._slot(field, shape[2], epoch, count)
                self._shard_bytes[slot.shard] += slot.cost
            elif (epoch, count) > (slot.epoch, slot.count):
                self._set(field, slot, epoch, count, bounded=False)
        self._dirty = True  # rewrite our own version over the observed one, even if ours already dominates


def describe(row: Row) -> dict[str, tuple[int, int]]:
    """A counter row decoded (for tests and debugging)."""
    out = {}
    for field, value in row.items():
        parsed = _parse(value)
        if parsed is not None:
            out[field] = parsed
    return out
