"""The cluster's API keys: a replicated registry table, so a key created on any node works on every node and
a revocation reaches every node within a gossip round or two (measured: see README "Authentication").

Where keys live: in the mesh's replicated state (``mesh.state`` registry ``api_keys``), in memory on every
node, and durably in a key store when one is configured (node/cluster/key_store.py: the Postgres or Redis
history backend, or a node's --keys-file), so a full-cluster restart keeps them. The replicated table is
what requests are checked against; the store is what a node starting with an empty table loads from.

Revocation writes a *revoked record* (last-writer-wins by the registry's hybrid clock) instead of removing
the entry: a removal is a tombstone forgotten after ``tombstone_ttl_s``, after which a node that missed it
(a long partition) could bring the key back; a revoked record can never be overtaken by the older create.
Revoked records count toward MAX_KEYS.

Revocations win: a node that has seen a key revoked never takes it back to live. A live record of it
arriving later (a node restarted from a stale keys file wrote it with a newer clock) leaves the key revoked
here and is answered by writing the revocation again, which then wins everywhere.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Final

from mesh.state import Change, ClusterState, Json
from node.auth.identity import NO_LIMITS, Limits
from node.auth.keys import Role, key_digest, new_key
from node.auth.records import KeyRecord

KEYS_TABLE: Final = "api_keys"
#: Records (live and revoked) the cluster holds: ~350 bytes each, so the table's one document stays well
#: under the state's compaction bound (max_doc_bytes, 1 MiB) and a join push-pull.
MAX_KEYS: Final = 2048


class TooManyKeys(Exception):
    """The key table is full (MAX_KEYS records, revoked ones included)."""


class ApiKeyTable:
    """The key table over one ClusterState. Call on the state's owner (the event loop) only.

    Lookups are served from a parsed cache kept current by the state's change feed, so verifying a key
    parses no JSON.
    """

    def __init__(self, state: ClusterState, *, clock: Callable[[], float] = time.time) -> None:
        self._state = state
        self._clock = clock
        self._cache: dict[str, KeyRecord] = {}
        self._listeners: list[Callable[[KeyRecord], None]] = []
        self._unsubscribe = state.subscribe(self._on_change)
        self._reload()

    def close(self) -> None:
        self._unsubscribe()

    def _reload(self) -> None:
        self._cache = {}
        for key_id, value in self._state.entries(KEYS_TABLE).items():
            self._cache_one(key_id, value)

    def _cache_one(self, key_id: str, value: Json | None) -> None:
        record = KeyRecord.from_json(value) if value is not None else None
        if record is not None and record.key_id == key_id:
            self._cache[key_id] = record
        else:
            self._cache.pop(key_id, None)

    def _on_change(self, change: Change) -> None:
        if change.kind != "entry" or change.table != KEYS_TABLE:
            return
        held = self._cache.get(change.key)
        if held is not None and held.revoked_at:
            record = KeyRecord.from_json(change.value) if change.value is not None else None
            if record is None or not record.revoked_at:
                self._write(held)  # revocations win (module docstring): assert it again, newer than that write
            return
        self._cache_one(change.key, change.value)
        now = self._cache.get(change.key)
        if now is not None and now != held:
            self._tell(now)

    def listen(self, callback: Callable[[KeyRecord], None]) -> Callable[[], None]:
        """Call ``callback(record)`` whenever a key's record changes here (written here or by a peer)."""
        self._listeners.append(callback)
        return lambda: self._listeners.remove(callback) if callback in self._listeners else None

    def _tell(self, record: KeyRecord) -> None:
        for callback in list(self._listeners):
            callback(record)

    def get(self, key_id: str) -> KeyRecord | None:
        return self._cache.get(key_id)

    def records(self) -> list[KeyRecord]:
        return sorted(self._cache.values(), key=lambda r: (r.created_at, r.key_id))

    def create(
        self,
        *,
        tenant: str,
        role: Role,
        name: str = "",
        expires_at: float = 0.0,
        limits: Limits = NO_LIMITS,
    ) -> tuple[str, KeyRecord]:
        """A new key, written to the table: (its full text, to be shown once, and its record). Raises
        TooManyKeys, ValueError for a bad field."""
        text, record = self.mint(tenant=tenant, role=role, name=name, expires_at=expires_at, limits=limits)
        self.put(record)
        return text, record

    def mint(
        self,
        *,
        tenant: str,
        role: Role,
        name: str = "",
        expires_at: float = 0.0,
        limits: Limits = NO_LIMITS,
    ) -> tuple[str, KeyRecord]:
        """A new key not yet written (``put`` it). Raises TooManyKeys, ValueError for a bad field."""
        if len(self._cache) >= MAX_KEYS:
            raise TooManyKeys(f"the cluster holds {MAX_KEYS} keys (revoked ones included)")
        while True:
            text, parsed = new_key()
            if parsed.key_id not in self._cache:
                break
        record = KeyRecord(
            key_id=parsed.key_id,
            digest=key_digest(parsed.key_id, parsed.secret),
            tenant=tenant,
            role=role,
            name=name,
            created_at=self._clock(),
            expires_at=expires_at,
            limits=limits,
        )
        return text, record

    def put(self, record: KeyRecord) -> None:
        """Write a minted record. Raises TooManyKeys."""
        if record.key_id not in self._cache and len(self._cache) >= MAX_KEYS:
            raise TooManyKeys(f"the cluster holds {MAX_KEYS} keys (revoked ones included)")
        self._write(record)

    def merge(self, record: KeyRecord) -> bool:
        """Take in a record from the durable store: a key unknown here is added; a revocation of a key live
        here is applied (revocations win); anything else changes nothing. Returns whether it wrote."""
        held = self._cache.get(record.key_id)
        if held is None:
            if len(self._cache) >= MAX_KEYS:
                return False
            self._write(record)
            return True
        if record.revoked_at and not held.revoked_at and record.digest == held.digest:
            self._write(replace(held, revoked_at=record.revoked_at))
            return True
        return False

    def revoke(self, key_id: str) -> KeyRecord | None:
        """Revoke a key everywhere; returns its revoked record, or None for an unknown id. Revoking twice
        keeps the first revocation time."""
        record = self._cache.get(key_id)
        if record is None:
            return None
        if not record.revoked_at:
            record = replace(record, revoked_at=self._clock())
            self._write(record)
        return record

    def _write(self, record: KeyRecord) -> None:
        value: Json = record.to_json()  # type: ignore[assignment]  # plain JSON types
        self._state.add(KEYS_TABLE, record.key_id, value, self._clock())
        changed = self._cache.get(record.key_id) != record
        self._cache[record.key_id] = record
        if changed:
            self._tell(record)
