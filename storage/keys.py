"""Durable API-key records: the KeyStore Protocol, its merge rule, and the JSON-file store of a node without a
shared backend.

A stored key is an opaque JSON body (the node's record: digest, tenant, role, limits, expiry; never the
secret) plus ``revoked_at``, kept apart so every backend can enforce the one rule that matters without
reading the body: **a revocation is never undone**. ``put`` of a key already stored replaces its body, but
its ``revoked_at`` only ever goes from 0 to a time, and then keeps the earliest time written. So a node
that writes an old live copy of a key (a stale file, a late flush) cannot bring a revoked key back.

Keys are cluster-wide, not per tenant (the tenant is inside the body); they never expire from the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

from storage.errors import StorageError, StorageUnavailable

JsonObject = Mapping[str, object]
#: Keys a store holds (live and revoked; the cluster's table holds at most 2048).
MAX_STORED_KEYS: Final = 10_000
FILE_VERSION: Final = 1


@dataclass(frozen=True, slots=True)
class StoredKey:
    key_id: str
    body: JsonObject
    #: Unix seconds the key was revoked at; 0: live.
    revoked_at: float = 0.0


def merge_revoked(stored: float, written: float) -> float:
    """The ``revoked_at`` a store keeps: once non-zero, the earliest non-zero time written."""
    if not stored:
        return written
    return min(stored, written) if written else stored


class KeyStore(Protocol):
    async def load_keys(self) -> list[StoredKey]:
        """Every stored key. Raises StorageUnavailable, StorageError."""
        ...

    async def put_keys(self, keys: Sequence[StoredKey]) -> None:
        """Upsert ``keys`` (one write; durable once it returns) by the merge rule above. Raises
        StorageUnavailable, StorageError."""
        ...


class FileKeyStore:
    """The keys in one JSON file, rewritten whole on every put: written to a temporary file (mode 0600) in
    the same directory, fsynced, then renamed over the old one, so a crash leaves the old or the new file,
    never a torn one. One file per node: each node writes every key it knows (see node/cluster/key_store.py).
    """

    def __init__(self, path: str | Path) -> None:
        self._path = Path(path)
        self._lock = asyncio.Lock()

    @property
    def path(self) -> Path:
        return self._path

    async def load_keys(self) -> list[StoredKey]:
        return list((await asyncio.to_thread(self._read)).values())

    async def put_keys(self, keys: Sequence[StoredKey]) -> None:
        async with self._lock:  # read-merge-write of one node's puts, one at a time
            await asyncio.to_thread(self._merge_write, keys)

    def _read(self) -> dict[str, StoredKey]:
        try:
            text = self._path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise StorageUnavailable(f"keys file {self._path}: {exc.strerror or exc}") from exc
        try:
            doc = json.loads(text)
            if not isinstance(doc, dict) or doc.get("version") != FILE_VERSION or not isinstance(doc["keys"], list):
                raise ValueError(f"expected {{'version': {FILE_VERSION}, 'keys': [...]}}")
            out: dict[str, StoredKey] = {}
            for entry in doc["keys"]:
                key = StoredKey(str(entry["id"]), dict(entry["body"]), float(entry.get("revoked_at") or 0))
                out[key.key_id] = key
        except (ValueError, KeyError, TypeError) as exc:
            # Not repaired by overwriting: an operator's file we cannot read must not lose its revocations.
            raise StorageError(f"keys file {self._path} is not readable: {exc}") from exc
        return out

    def _merge_write(self, keys: Sequence[StoredKey]) -> None:
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            lock = os.open(self._path.with_name(f".{self._path.name}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise StorageUnavailable(f"keys file {self._path}: {exc.strerror or exc}") from exc
        try:
            # The node's processes (--processes) may share the file: one read-merge-write at a time.
            fcntl.flock(lock, fcntl.LOCK_EX)
            self._merge_write_locked(keys)
        finally:
            os.close(lock)

    def _merge_write_locked(self, keys: Sequence[StoredKey]) -> None:
        current = self._read()
        for key in keys:
            old = current.get(key.key_id)
            revoked = merge_revoked(old.revoked_at, key.revoked_at) if old is not None else key.revoked_at
            current[key.key_id] = StoredKey(key.key_id, key.body, revoked)
        if len(current) > MAX_STORED_KEYS:
            raise StorageError(f"keys file {self._path}: more than {MAX_STORED_KEYS} keys")
        doc = {
            "version": FILE_VERSION,
            "keys": [{"id": k.key_id, "body": k.body, "revoked_at": k.revoked_at} for k in current.values()],
        }
        data = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{self._path.name}.", dir=self._path.parent)  # mode 0600
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(data)
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(tmp, self._path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            _fsync_dir(self._path.parent)
        except OSError as exc:
            raise StorageUnavailable(f"keys file {self._path}: {exc.strerror or exc}") from exc


def _fsync_dir(directory: Path) -> None:
    """Make the rename itself durable (POSIX: the directory entry is data of the directory)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
