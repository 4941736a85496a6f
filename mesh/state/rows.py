"""Single-writer rows: ``tables[table][node_id] = row``, each row written whole by its owner only.

Storage: a table is ``shards`` documents named ``r/<table>/<shards>/<i>``; a row's fields are spread over
them by ``crc32(field) % shards`` and each document holds, under the owner's node id, the JSON text of
that owner's fields of that shard. So every writer overwrites exactly one key per document (what keeps
Yrs documents from growing, see crdt_doc.py), and a row too big for one gossip packet can still travel
as several small deltas (only the shards whose fields changed are rewritten). With the default of one
shard a row is one value, updated atomically; with more, each field is atomic and a reader may briefly
see a mix of old and new shards.

The owner is authoritative for its own rows: the value it last wrote in this life (its *intent*) is
rewritten whenever a peer's state shows something else (its previous life's row, or a janitor's
deletion while we were thought dead); a row of a previous life that was never rewritten is deleted.
Tables with an *adopter* (the counters) merge instead: the owner folds what it sees into its own state
and republishes it.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Protocol

from mesh.state.config import StateConfig
from mesh.state.crdt_doc import KeyChange
from mesh.state.values import Change, Json, Row, StateLimitError, dumps

#: Folds the observed version of one of our own row shards into the owner's state, which publishes the
#: result itself (the counters: at their next flush, where a failure cannot escape into a peer's merge).
Adopter = Callable[[Row], None]


class DocWriter(Protocol):
    def write(self, doc: str, sets: Mapping[str, str | None]) -> None:
        """Write ``sets`` (None deletes) in one local transaction of document ``doc``."""
        ...


def row_doc_name(table: str, shards: int, index: int) -> str:
    return f"r/{table}/{shards}/{index}"


def parse_row_doc(name: str) -> tuple[str, int, int] | None:
    """(table, shards, index) of a row document name, or None if it is not one."""
    parts = name.split("/")
    if len(parts) != 4 or parts[0] != "r" or not parts[2].isdigit() or not parts[3].isdigit():
        return None
    shards, index = int(parts[2]), int(parts[3])
    if not 0 <= index < shards:
        return None
    return parts[1], shards, index


def field_shard(field: str, shards: int) -> int:
    """Which shard a field lives in: stable across processes and versions (not ``hash()``)."""
    return zlib.crc32(field.encode()) % shards if shards > 1 else 0


def parse_row(text: str | None) -> dict[str, Json] | None:
    """A stored row shard, or None if absent or not a JSON object (a peer bug: ignored)."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


class RowTables:
    """Not thread-safe: owned by one ClusterState."""

    __slots__ = ("_adopters", "_config", "_intent", "_merged", "_node", "_parsed", "_writer")

    def __init__(self, node_id: str, config: StateConfig, writer: DocWriter) -> None:
        self._node = node_id
        self._config = config
        self._writer = writer
        #: table -> the JSON text of each shard of our own row (None: empty), as last written in this life.
        self._intent: dict[str, list[str | None]] = {}
        #: document -> owner -> parsed row shard.
        self._parsed: dict[str, dict[str, dict[str, Json]]] = {}
        #: table -> owner -> merged row (a cache; dropped when a shard of the table changes).
        self._merged: dict[str, dict[str, Row]] = {}
        self._adopters: dict[str, Adopter] = {}

    def set_adopter(self, table: str, adopter: Adopter) -> None:
        self._adopters[table] = adopter

    # -- writing --

    def set_row(self, table: str, row: Row) -> None:
        """Replace our row. Raises StateLimitError if a shard's JSON exceeds max_row_bytes, ValueError
        or TypeError if the row is not JSON (NaN, non-string keys, other objects)."""
        shards = self._config.shards_of(table)
        parts: list[dict[str, Json]] = [{} for _ in range(shards)]
        for name, value in row.items():
            if not isinstance(name, str):
                raise TypeError(f"row field names must be strings, got {name!r}")
            parts[field_shard(name, shards)][name] = value
        # An empty shard of a sharded row is not stored at all (a row with no fields is absent there).
        texts: list[str | None] = [dumps(part) if part or shards == 1 else None for part in parts]
        for text in texts:
            if text is not None and len(text.encode()) > self._config.max_row_bytes:
                raise StateLimitError(f"row of {table!r}: a shard of {len(text)} bytes exceeds max_row_bytes")
        self._intent[table] = texts
        for index, text in enumerate(texts):
            self._writer.write(row_doc_name(table, shards, index), {self._node: text})

    def delete_row(self, table: str) -> None:
        shards = self._config.shards_of(table)
        self._intent.pop(table, None)
        for index in range(shards):
            self._writer.write(row_doc_name(table, shards, index), {self._node: None})

    # -- reading --

    def rows(self, table: str) -> Mapping[str, Row]:
        cached = self._merged.get(table)
        if cached is None:
            cached = self._merged[table] = {}
            for owner in {o for i in range(self._config.shards_of(table)) for o in self._doc_parsed(table, i)}:
                self._remerge(table, owner)
        return cached

    def _doc_parsed(self, table: str, index: int) -> dict[str, dict[str, Json]]:
        return self._parsed.get(row_doc_name(table, self._config.shards_of(table), index), {})

    def _remerge(self, table: str, owner: str) -> None:
        """Recompute one owner's merged row in the table cache."""
        merged: dict[str, Json] | None = None
        for index in range(self._config.shards_of(table)):
            part = self._doc_parsed(table, index).get(owner)
            if part is not None:
                merged = dict(part) if merged is None else {**merged, **part}
        rows = self._merged.setdefault(table, {})
        if merged is None:
            rows.pop(owner, None)
        else:
            rows[owner] = merged

    def shard(self, table: str, index: int) -> Mapping[str, Mapping[str, Json]]:
        """Every owner's fields in one shard of ``table`` (used by the counters, which shard by key)."""
        return self._parsed.get(row_doc_name(table, self._config.shards_of(table), index), {})

    def owners(self) -> set[str]:
        return {owner for parsed in self._parsed.values() for owner in parsed}

    # -- changes --

    def on_changes(self, doc: str, changes: Iterable[KeyChange], *, local: bool) -> list[Change]:
        """Fold a document's changed keys into the view; returns row-level changes for subscribers and,
        for remote changes to our own row, re-asserts our intent."""
        parsed_name = parse_row_doc(doc)
        if parsed_name is None:
            return []
        table, shards, index = parsed_name
        ours = shards == self._config.shards_of(table)
        parsed = self._parsed.setdefault(doc, {})
        events: list[Change] = []
        reassert: list[dict[str, Json] | None] = []
        for change in changes:
            owner = change.key
            before = self.rows(table).get(owner) if ours else None
            value = parse_row(change.new)
            if value is None:
                parsed.pop(owner, None)
            else:
                parsed[owner] = value
            if not ours:
                continue
            self._remerge(table, owner)
            if not table.startswith("~"):
                after = self.rows(table).get(owner)
                if before != after:
                    events.append(Change("row", table, owner, _as_json(after), _as_json(before), local))
            if owner == self._node and not local:
                reassert.append(value)
        for observed in reassert:
            self._reassert(table, shards, index, observed)
        return events

    def _reassert(self, table: str, shards: int, index: int, observed: dict[str, Json] | None) -> None:
        adopter = self._adopters.get(table)
        if adopter is not None:
            if observed is not None:
                adopter(observed)
            elif table in self._intent:
                self._writer.write(row_doc_name(table, shards, index), {self._node: self._intent[table][index]})
            return
        intent = self._intent.get(table)
        text = intent[index] if intent is not None else None
        self._writer.write(row_doc_name(table, shards, index), {self._node: text})

    # -- garbage collection --

    def collect(self, docs: Mapping[str, Collection[str]], gone: Collection[str]) -> None:
        """Delete the rows of ``gone`` owners from ``docs`` (document -> keys present). Idempotent: any
        node may run it; a concurrent newer write by a returning owner survives the deletion."""
        for doc, keys in docs.items():
            if parse_row_doc(doc) is None:
                continue
            doomed = {key: None for key in keys if key in gone and key != self._node}
            if doomed:
                self._writer.write(doc, doomed)


def _as_json(row: Row | None) -> Json:
    return dict(row) if row is not None else None
