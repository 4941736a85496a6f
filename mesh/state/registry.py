"""Shared registries: entries any node may add or remove, surviving the death of whoever wrote them.

A registry is one document ``g/<table>``. An entry's state is a set of *slots*, one per node that wrote
it, stored under ``"<key>\\x1f<slot owner>"``; a slot holds ``[wall_ms, logical, origin, deleted, value]``
(JSON text). Only a slot's owner writes it, so pycrdt never resolves a conflict by client id; the
entry's value is the slot with the highest ``(hlc, origin)`` — a last-writer-wins register ordered by
our own hybrid logical clock, with removals as tombstones. Adding and removing are the same operation
(a new slot value with a fresh HLC, greater than every HLC this node has seen), so concurrent add and
remove on different nodes converge on the later one everywhere, and a removal reaches everyone.

Garbage collection keeps the winner unchanged (so it never changes the visible value):
* an owner deletes its own slots that another slot dominates, or that duplicate (same HLC and origin)
  a slot of a live node with a smaller name;
* a winning tombstone older than ``tombstone_ttl_s`` is deleted by its owner: the entry is gone;
* the janitor (the live node with the smallest name) copies the winning slots of nodes gone for
  ``dead_gc_delay_s`` into its own slots (same HLC and origin, so the same value wins) and deletes
  theirs: entries outlive their writer.
A tombstone must outlive any partition that is healed (see ``merge_old_view``); an entry whose removal
was forgotten on one side of a longer partition can come back.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from mesh.state.config import KEY_SEPARATOR, MAX_ENTRY_KEY_BYTES, StateConfig, check_key
from mesh.state.crdt_doc import KeyChange
from mesh.state.hlc import Hlc, HybridClock
from mesh.state.rows import DocWriter
from mesh.state.values import Change, Json, StateLimitError, dumps


def registry_doc_name(table: str) -> str:
    return f"g/{table}"


def parse_registry_doc(name: str) -> str | None:
    """The table of a registry document name, or None."""
    kind, sep, table = name.partition("/")
    return table if kind == "g" and sep and table and "/" not in table else None


@dataclass(frozen=True, slots=True)
class Slot:
    hlc: Hlc
    origin: str
    deleted: bool
    value: Json
    text: str = field(compare=False)

    @property
    def rank(self) -> tuple[Hlc, str]:
        return (self.hlc, self.origin)

    @classmethod
    def make(cls, hlc: Hlc, origin: str, value: Json, *, deleted: bool) -> Slot:
        text = dumps([hlc.wall_ms, hlc.logical, origin, 1 if deleted else 0, None if deleted else value])
        return cls(hlc, origin, deleted, None if deleted else value, text)


def parse_slot(text: str | None) -> Slot | None:
    """A stored slot, or None if absent or malformed (a peer bug: ignored)."""
    if text is None:
        return None
    try:
        raw = json.loads(text)
    except ValueError:
        return None
    if not isinstance(raw, list) or len(raw) != 5:
        return None
    wall, logical, origin, deleted, value = raw
    if not (isinstance(wall, int) and isinstance(logical, int) and isinstance(origin, str)):
        return None
    if deleted not in (0, 1) or isinstance(deleted, bool):
        return None
    return Slot(Hlc(wall, logical), origin, deleted == 1, value, text)


def slot_key(key: str, owner: str) -> str:
    return f"{key}{KEY_SEPARATOR}{owner}"


class Registry:
    """Every registry table of one node. Not thread-safe: owned by one ClusterState."""

    __slots__ = ("_clock", "_config", "_entries", "_intent", "_node", "_slots", "_writer")

    def __init__(self, node_id: str, config: StateConfig, writer: DocWriter, clock: HybridClock) -> None:
        self._node = node_id
        self._config = config
        self._writer = writer
        self._clock = clock
        #: table -> key -> slot owner -> slot.
        self._slots: dict[str, dict[str, dict[str, Slot]]] = {}
        #: table -> key -> visible value (winner not a tombstone).
        self._entries: dict[str, dict[str, Json]] = {}
        #: table -> key -> our own slot as we want it stored.
        self._intent: dict[str, dict[str, Slot]] = {}

    # -- writing --

    def add(self, table: str, key: str, value: Json, now: float) -> None:
        """Raises StateLimitError for an oversized value, ValueError/TypeError for a bad key or value."""
        self._put(table, key, Slot.make(self._clock.tick(now), self._node, value, deleted=False))

    def remove(self, table: str, key: str, now: float) -> None:
        """Raises ValueError for a bad key. Removing an unknown key still records the removal: it wins
        over a concurrent, earlier add we have not seen yet."""
        self._put(table, key, Slot.make(self._clock.tick(now), self._node, None, deleted=True))

    def _put(self, table: str, key: str, slot: Slot) -> None:
        check_key(key, "entry key", MAX_ENTRY_KEY_BYTES)
        if len(slot.text.encode()) > self._config.max_row_bytes:
            raise StateLimitError(f"entry {key!r} of {table!r}: {len(slot.text)} bytes exceeds max_row_bytes")
        self._intent.setdefault(table, {})[key] = slot
        self._writer.write(registry_doc_name(table), {slot_key(key, self._node): slot.text})

    # -- reading --

    def entries(self, table: str) -> Mapping[str, Json]:
        return self._entries.get(table, {})

    def winner(self, table: str, key: str) -> Slot | None:
        slots = self._slots.get(table, {}).get(key)
        return max(slots.values(), key=_rank) if slots else None

    def winners(self, table: str) -> dict[str, Slot]:
        out = {}
        for key, slots in self._slots.get(table, {}).items():
            if slots:
                out[key] = max(slots.values(), key=_rank)
        return out

    def slot_count(self, table: str) -> int:
        return sum(len(slots) for slots in self._slots.get(table, {}).values())

    # -- changes --

    def on_changes(self, doc: str, changes: Iterable[KeyChange], *, local: bool) -> list[Change]:
        table = parse_registry_doc(doc)
        if table is None:
            return []
        slots_of = self._slots.setdefault(table, {})
        entries = self._entries.setdefault(table, {})
        touched: dict[str, tuple[bool, Json]] = {}  # key -> (visible, value) before this batch
        ours: list[tuple[str, Slot | None]] = []
        for change in changes:
            key, sep, owner = change.key.rpartition(KEY_SEPARATOR)
            if not sep or not key:
                continue
            if key not in touched:
                touched[key] = (key in entries, entries.get(key))
            slot = parse_slot(change.new)
            slots = slots_of.setdefault(key, {})
            if slot is None:
                slots.pop(owner, None)
                if not slots:
                    del slots_of[key]
            else:
                slots[owner] = slot
                self._clock.observe(slot.hlc)
            if owner == self._node and not local:
                ours.append((key, slot))
        events = []
        for key, (was_visible, before) in touched.items():
            win = self.winner(table, key)
            visible = win is not None and not win.deleted
            after = win.value if win is not None and visible else None
            if visible:
                entries[key] = after
            else:
                entries.pop(key, None)
            if before != after or was_visible != visible:
                events.append(Change("entry", table, key, after, before, local))
        for key, observed in ours:
            self._reconcile(table, key, observed)
        return events

    def _reconcile(self, table: str, key: str, observed: Slot | None) -> None:
        """A peer's state shows our slot of ``key`` as ``observed`` (our previous life's, a janitor's
        deletion, or a concurrent write of our previous life that pycrdt ordered after ours)."""
        intents = self._intent.setdefault(table, {})
        intent = intents.get(key)
        if observed is None:
            intents.pop(key, None)  # deleted because dominated, expired, or adopted by the janitor
        elif intent is None or observed.rank > intent.rank:
            intents[key] = observed
        elif observed.text != intent.text:
            self._writer.write(registry_doc_name(table), {slot_key(key, self._node): intent.text})

    # -- garbage collection and epochs --

    def collect(self, now: float, gone: Collection[str], *, janitor: bool) -> None:
        """One garbage-collection pass (see the module docstring). ``gone``: nodes dead or left for
        longer than dead_gc_delay_s; only the janitor touches their slots."""
        ttl_ms = self._config.tombstone_ttl_s * 1000
        now_ms = now * 1000
        me = self._node
        for table, keys in self._slots.items():
            sets: dict[str, str | None] = {}
            for key, slots in keys.items():
                win = max(slots.values(), key=_rank)
                expired = win.deleted and now_ms - win.hlc.wall_ms > ttl_ms
                live_holders = sorted(o for o, s in slots.items() if s.rank == win.rank and o not in gone)
                mine_wanted: str | None = None
                adopt = False
                for owner, slot in slots.items():
                    if owner != me and not (janitor and owner in gone):
                        continue
                    if owner != me:  # a gone node's slot, janitor only
                        if not expired and slot.rank == win.rank and not live_holders:
                            adopt = True
                            mine_wanted = slot.text
                        sets[slot_key(key, owner)] = None
                        continue
                    keep = not expired and slot.rank == win.rank and live_holders[0] == me
                    if keep:
                        mine_wanted = slot.text
                if me in slots and mine_wanted is None:
                    sets[slot_key(key, me)] = None
                elif mine_wanted is not None and (adopt or me in slots):
                    sets[slot_key(key, me)] = mine_wanted
                    if adopt:
                        adopted = parse_slot(mine_wanted)
                        if adopted is not None:
                            self._intent.setdefault(table, {})[key] = adopted
            if sets:
                for skey, value in sets.items():
                    if value is None and skey.endswith(KEY_SEPARATOR + me):
                        self._intent.get(table, {}).pop(skey.rpartition(KEY_SEPARATOR)[0], None)
                self._writer.write(registry_doc_name(table), sets)

    def merge_old_view(self, table: str, old: Mapping[str, Slot], gen_wall_ms: int) -> None:
        """After adopting a compacted generation of ``table``'s document, bring over what our previous
        generation knew and the compactor did not: the same last-writer-wins join, done on values.

        A key absent from the new generation is brought back only if its winner is a live value newer
        than ``gen_wall_ms - tombstone_ttl_s``: an older one may have been removed by a tombstone that
        has since expired (a tombstone is kept tombstone_ttl_s past its HLC, which exceeds the value's).
        """
        ttl_ms = self._config.tombstone_ttl_s * 1000
        sets: dict[str, str | None] = {}
        for key, old_win in old.items():
            new_win = self.winner(table, key)
            if new_win is None:
                if old_win.deleted or old_win.hlc.wall_ms < gen_wall_ms - ttl_ms:
                    continue
            elif old_win.rank <= new_win.rank:
                continue
            self._intent.setdefault(table, {})[key] = old_win
            sets[slot_key(key, self._node)] = old_win.text
        if sets:
            self._writer.write(registry_doc_name(table), sets)


def _rank(slot: Slot) -> tuple[Hlc, str]:
    return slot.rank
