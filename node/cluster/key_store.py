"""The API keys' durable copy: the cluster's key table (node/cluster/api_keys.py) written through to a key
store (storage/keys.py), so keys survive a restart of every node at once.

Why both: the replicated table is what makes a key work, and a revocation bite, on every node within a
second, with no store on the request path (a key check is a dict lookup). But it lives in memory, so when
every node stops at once it is gone. The store is its durable copy: the Postgres or Redis history backend
when one is configured (one copy shared by all nodes), else a node's own ``--keys-file``.

- At start each node loads the store into its table (``load``) before it serves: a key unknown to the table
  is added, a stored revocation is applied to a live key (revocations win, in the table and in the store).
  If the store is down then, the node starts with what the cluster knows and keeps retrying the load.
- Every change to the table this node sees (made here or by a peer) is written to the store in the
  background, batched, retried until it lands. So every node's keys file holds the whole cluster's keys, and
  a revocation made while one node's store write failed still reaches the store through the others.
- Creating a key writes the store first: a key is shown to its caller only once it is durable.
  Revoking writes the table first (it bites at once everywhere), then the store.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from node.auth.identity import NO_LIMITS, Limits
from node.auth.keys import Role
from node.auth.records import KeyRecord
from node.cluster.api_keys import ApiKeyTable
from storage.errors import StorageError
from storage.keys import KeyStore, StoredKey

log = logging.getLogger(__name__)

#: Pause after a failed store write or load before the next try.
RETRY_S: Final = 1.0


def stored(record: KeyRecord) -> StoredKey:
    return StoredKey(record.key_id, record.to_json(), record.revoked_at)


def from_stored(key: StoredKey) -> KeyRecord | None:
    """The record of a stored key (its revocation from the store's own column), or None if unreadable."""
    record = KeyRecord.from_json(dict(key.body))
    if record is None or record.key_id != key.key_id:
        return None
    if key.revoked_at and not record.revoked_at:
        record = KeyRecord.from_json({**dict(key.body), "revoked_at": key.revoked_at})
    return record


class DurableKeys:
    """The key table plus its store (None: keys live in the cluster's memory only). Loop-owned."""

    def __init__(self, table: ApiKeyTable, store: KeyStore | None, *, retry_s: float = RETRY_S) -> None:
        self.table = table
        self._store = store
        self._retry_s = retry_s
        self._loaded = store is None
        #: What the store is known to hold (key id -> record): a change equal to it is not written again.
        self._known: dict[str, KeyRecord] = {}
        self._dirty: set[str] = set()
        self._wake = asyncio.Event()
        self._unlisten = table.listen(self._changed) if store is not None else None

    @property
    def durable(self) -> bool:
        return self._store is not None

    @property
    def loaded(self) -> bool:
        return self._loaded

    def close(self) -> None:
        if self._unlisten is not None:
            self._unlisten()

    def _changed(self, record: KeyRecord) -> None:
        if self._known.get(record.key_id) != record:
            self._dirty.add(record.key_id)
            self._wake.set()

    async def load(self) -> int:
        """Merge the store into the table; returns the keys it changed. Raises StorageError (the store is
        down or unreadable)."""
        if self._store is None:
            return 0
        changed = 0
        keys = await self._store.load_keys()
        for key in keys:
            record = from_stored(key)
            if record is None:
                log.warning("key store: ignoring the unreadable record of key %r", key.key_id[:16])
                continue
            self._known[record.key_id] = record
            changed += self.table.merge(record)
        # Keys the table had before the load (from peers) that the store lacks or holds differently.
        self._dirty = {r.key_id for r in self.table.records() if self._known.get(r.key_id) != r}
        if self._dirty:
            self._wake.set()
        self._loaded = True
        log.info("key store: loaded %d key(s), %d new or newly revoked here", len(keys), changed)
        return changed

    async def flush(self) -> None:
        """Write the changed records to the store now. Raises StorageError (they stay queued)."""
        if self._store is None or not self._dirty:
            return
        ids, self._dirty = self._dirty, set()
        records = [r for r in map(self.table.get, ids) if r is not None]
        try:
            await self._store.put_keys([stored(r) for r in records])
        except BaseException:
            self._dirty |= ids
            self._wake.set()
            raise
        for record in records:
            self._known[record.key_id] = record

    async def flush_at_exit(self, timeout_s: float = 5.0) -> None:
        """The last writes at shutdown, bounded; a failure is logged (the other nodes hold the changes)."""
        try:
            await asyncio.wait_for(self.flush(), timeout_s)
        except (StorageError, TimeoutError) as exc:
            log.warning("key store: %d key change(s) not written at exit: %s", len(self._dirty), exc)

    async def run(self) -> None:
        """Load (until it succeeds), then write every change as it comes (a supervised background task)."""
        if self._store is None:
            return
        while not self._loaded:
            try:
                await self.load()
            except StorageError as exc:
                log.warning("key store: cannot load keys (%s); serving the cluster's keys, retrying", exc)
                await asyncio.sleep(self._retry_s)
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self.flush()
            except StorageError as exc:
                log.warning("key store: cannot write %d key change(s) (%s); retrying", len(self._dirty), exc)
                await asyncio.sleep(self._retry_s)

    # -- the admin API's writes --

    async def create(
        self,
        *,
        tenant: str,
        role: Role,
        name: str = "",
        expires_at: float = 0.0,
        limits: Limits = NO_LIMITS,
    ) -> tuple[str, KeyRecord]:
        """A new key, durable before it is returned. Raises TooManyKeys, ValueError, StorageError (nothing
        was created)."""
        text, record = self.table.mint(tenant=tenant, role=role, name=name, expires_at=expires_at, limits=limits)
        if self._store is not None:
            await self._store.put_keys([stored(record)])
            self._known[record.key_id] = record
        self.table.put(record)
        return text, record

    async def revoke(self, key_id: str) -> KeyRecord | None:
        """Revoke everywhere at once, then durably. Returns the revoked record (None: unknown id). Raises
        StorageError when the store write failed: the key is revoked in the cluster all the same, and the
        write is retried in the background."""
        record = self.table.revoke(key_id)
        if record is not None and self._store is not None:
            self._dirty.add(key_id)  # a repeated revoke writes again: the way to retry by hand
            await self.flush()
        return record
