"""storage/keys.py: API-key records survive the store being reopened, and a stored revocation is never undone,
on real Postgres and Redis and in the JSON file."""

from __future__ import annotations

import stat
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from storage import open_stores
from storage.errors import StorageError
from storage.keys import FileKeyStore, KeyStore, StoredKey
from tests.storage.conftest import backend_config

BACKENDS = ("postgres", "redis", "file")


@pytest.fixture(params=BACKENDS)
async def key_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[KeyStore]:
    if request.param == "file":
        yield FileKeyStore(tmp_path / "keys.json")
        return
    async with open_stores(backend_config(request, request.param)) as stores:
        assert stores.keys is not None
        yield stores.keys


async def _reopened(store: KeyStore, request: pytest.FixtureRequest) -> AsyncIterator[KeyStore]:
    """The same data through a fresh store (a new process would see this)."""
    if isinstance(store, FileKeyStore):
        yield FileKeyStore(store.path)
        return
    backend = request.node.callspec.params["key_store"]
    async with open_stores(backend_config(request, backend)) as stores:
        assert stores.keys is not None
        yield stores.keys


def _body(key_id: str, **extra: object) -> dict[str, object]:
    return {"id": key_id, "digest": "d" * 64, "tenant": "acme", "role": "user", **extra}


async def test_keys_survive_reopening_and_revocation_is_never_undone(
    key_store: KeyStore, request: pytest.FixtureRequest
) -> None:
    a, b = uuid.uuid4().hex[:8], uuid.uuid4().hex[:8]
    await key_store.put_keys([StoredKey(a, _body(a)), StoredKey(b, _body(b, name="x"))])
    await key_store.put_keys([StoredKey(b, _body(b, name="x"), revoked_at=200.5)])
    # A stale live copy (an old file, a late flush) and a later revocation time: b stays revoked at 200.5.
    await key_store.put_keys([StoredKey(b, _body(b, name="stale"), revoked_at=0.0)])
    await key_store.put_keys([StoredKey(b, _body(b, name="x"), revoked_at=300.0)])
    async for reopened in _reopened(key_store, request):
        found = {k.key_id: k for k in await reopened.load_keys()}
        assert found[a].revoked_at == 0 and found[a].body == _body(a)
        assert found[b].revoked_at == 200.5
        assert found[b].body["tenant"] == "acme"
        # An earlier revocation time than the stored one is kept (the first revocation wins).
        await reopened.put_keys([StoredKey(b, _body(b), revoked_at=100.0)])
        assert {k.key_id: k for k in await reopened.load_keys()}[b].revoked_at == 100.0


async def test_the_keys_file_is_private_and_replaced_atomically(tmp_path: Path) -> None:
    path = tmp_path / "state" / "keys.json"
    store = FileKeyStore(path)
    assert await store.load_keys() == []  # no file yet: no keys
    await store.put_keys([StoredKey("aaaaaaaa", _body("aaaaaaaa"))])
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    await store.put_keys([StoredKey("bbbbbbbb", _body("bbbbbbbb"))])
    assert sorted(k.key_id for k in await FileKeyStore(path).load_keys()) == ["aaaaaaaa", "bbbbbbbb"]
    assert sorted(p.name for p in path.parent.iterdir()) == [".keys.json.lock", "keys.json"]  # no temporary file


async def test_an_unreadable_keys_file_is_an_error_and_is_not_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    path.write_text("{not json")
    store = FileKeyStore(path)
    with pytest.raises(StorageError, match="not readable"):
        await store.load_keys()
    with pytest.raises(StorageError):
        await store.put_keys([StoredKey("aaaaaaaa", _body("aaaaaaaa"))])
    assert path.read_text() == "{not json"
