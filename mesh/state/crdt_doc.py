"""One pycrdt (Yrs) document of the cluster state: a flat map ``key -> JSON text``, and nothing else.

Why so plain (measured, see MESH-NOTES.md and mesh/README.md):
* every value is a JSON *string*, never a pycrdt number: numbers would come back as float64 and ints
  >= 2**70 crash inside Rust; JSON text keeps ints exact and makes equality a string compare;
* each writer overwrites **one** key per document (its own row or row shard). Overwrites of several
  keys by one client leave one ~12-byte tombstone per overwrite that Yrs can never merge away (3 keys
  x 30k overwrites: 370 KB), while one key per writer squashes to a constant. So a table with several
  rows per writer is several documents, never several keys of one (registries are the exception: low
  churn, bounded by compaction);
* ``Replica`` is owned by one thread (the mesh's event loop): pycrdt docs race across threads.

Remote updates are applied in a transaction with origin ``REMOTE`` so the local-update hook ignores
them; every change (local or remote) is recorded for the owner to drain.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from pycrdt import Doc, Map, MapEvent, TransactionEvent

from mesh.state.wire import Generation, StateDecodeError, decode_sv, encode_sv

#: Transaction origin of updates that came from peers (observers must not re-broadcast them).
REMOTE: Final = "remote"
#: Transaction origin of our own writes.
LOCAL: Final = "local"

_ROOT: Final = "t"


@dataclass(frozen=True, slots=True)
class LocalWrite:
    """The Yrs update of one local transaction: our ``client`` wrote clocks ``[start, end)``."""

    update: bytes
    client: int
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class KeyChange:
    key: str
    old: str | None
    new: str | None


class Replica:
    """Not thread-safe: one owner."""

    __slots__ = ("_changes", "_doc", "_local_update", "_map", "_remote", "_subs", "_sv", "_values", "gen", "name")

    def __init__(self, name: str, gen: Generation) -> None:
        self.name = name
        self.gen = gen
        self._doc: Doc[Any] = Doc()
        self._map: Map[str] = self._doc.get(_ROOT, type=Map)
        self._values: dict[str, str] = {}
        self._changes: list[KeyChange] = []
        self._local_update: bytes | None = None
        self._remote = False
        self._sv: dict[int, int] | None = None
        self._subs = (self._map.observe(self._on_map), self._doc.observe(self._on_txn))

    # -- building --

    @classmethod
    def rebuilt(cls, name: str, gen: Generation, values: Mapping[str, str]) -> Replica:
        """A fresh document (new client id, no history) holding ``values``: compaction."""
        replica = cls(name, gen)
        replica.write(values)
        return replica

    # -- reading --

    @property
    def client_id(self) -> int:
        return int(self._doc.client_id)

    @property
    def values(self) -> Mapping[str, str]:
        return self._values

    def sv(self) -> Mapping[int, int]:
        if self._sv is None:
            self._sv = decode_sv(self._doc.get_state())
        return self._sv

    def sv_bytes(self) -> bytes:
        return encode_sv(self.sv())

    def clock(self, client: int) -> int:
        return self.sv().get(client, 0)

    def full(self) -> bytes:
        return self._doc.get_update()

    def diff(self, base: Mapping[int, int]) -> bytes:
        """Everything this document has that a replica at state vector ``base`` lacks (plus the whole
        delete set, which Yrs always includes)."""
        return self._doc.get_update(encode_sv(base))

    def structs_since(self, base: Mapping[int, int], sv: Mapping[int, int]) -> bytes:
        """Like ``diff(base)`` but with an empty delete set: the items only. ``sv`` is our state vector.

        A diff's delete set is the whole document's, including deletions of other writers' older values
        whose newer values the diff does not carry when ``base`` excludes them; applied alone it would
        make those keys vanish until the newer values arrive. A map overwrite needs no delete set (the
        receiver deletes the older value when it integrates the newer one), so a range of one writer's
        overwrites travels safely as items only. Yrs' v1 update is ``items, delete set``; the delete set
        is what a diff against our own state vector holds after its empty item section (``0x00``).
        """
        diff = self.diff(base)
        empty = self.diff(sv)
        delete_set = empty[1:]
        if empty[:1] != b"\x00" or not diff.endswith(delete_set):  # pragma: no cover - a Yrs format change
            raise StateDecodeError("unexpected Yrs update layout")
        return diff[: len(diff) - len(delete_set)] + b"\x00"

    def encoded_size(self) -> int:
        return len(self._doc.get_update())

    def _drain_changes(self) -> list[KeyChange]:
        changes, self._changes = self._changes, []
        return changes

    # -- writing --

    def write(self, sets: Mapping[str, str | None]) -> tuple[LocalWrite | None, list[KeyChange]]:
        """Set (or, for None, delete) keys in one local transaction. Returns its update (None if nothing
        changed) and the keys that changed."""
        todo = {k: v for k, v in sets.items() if self._values.get(k) != v}
        if not todo:
            return None, []
        client = self.client_id
        start = self.clock(client)
        self._local_update = None
        with self._doc.transaction(origin=LOCAL):
            for key, value in todo.items():
                if value is None:
                    del self._map[key]
                else:
                    self._map[key] = value
        update = self._take_local_update()
        changes = self._drain_changes()
        if update is None:  # pragma: no cover - Yrs reports every committed local transaction
            return None, changes
        return LocalWrite(update, client, start, self.clock(client)), changes

    def apply(self, update: bytes) -> list[KeyChange]:
        """Apply a peer's update (idempotent; out-of-order parts wait inside Yrs for what they need) and
        return the keys that changed. Raises StateDecodeError if Yrs rejects the bytes."""
        self._remote = True
        try:
            with self._doc.transaction(origin=REMOTE):
                self._doc.apply_update(update)
        except BaseException as exc:
            # A malformed update may panic inside Rust (pyo3's PanicException is a BaseException).
            if isinstance(exc, Exception) or type(exc).__name__ == "PanicException":
                raise StateDecodeError(f"update rejected by Yrs: {exc}") from exc
            raise
        finally:
            self._remote = False
        return self._drain_changes()

    # -- observers --

    def _take_local_update(self) -> bytes | None:
        update, self._local_update = self._local_update, None
        return update

    def _on_txn(self, event: TransactionEvent) -> None:
        after: bytes = getattr(event, "after_state")  # noqa: B009 - missing from pycrdt's stub
        self._sv = decode_sv(after)
        if not self._remote:
            self._local_update = bytes(event.update)

    def _on_map(self, event: MapEvent) -> None:
        keys: dict[str, dict[str, object]] = getattr(event, "keys")  # noqa: B009 - untyped slot
        for key, info in keys.items():
            old = self._values.get(key)
            new = info.get("newValue") if info.get("action") != "delete" else None
            if isinstance(new, str):
                self._values[key] = new
            else:
                self._values.pop(key, None)  # deleted, or a non-string value no node writes: ignored
                new = None
            if old != new:
                self._changes.append(KeyChange(key, old, new))
