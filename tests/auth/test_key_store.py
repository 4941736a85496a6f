"""node/cluster/key_store.py and the key table's "revocations win": keys written through to a real key store
(the JSON file; Postgres and Redis in tests/storage/test_keys.py and the process test), loaded by a node that
starts empty, and a revoked key never brought back by a stale copy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mesh.state import ClusterState
from node.auth.authenticator import ApiKeyAuthenticator, AuthFailure
from node.auth.identity import Identity
from node.cluster.api_keys import ApiKeyTable
from node.cluster.key_store import DurableKeys, stored
from storage.errors import StorageError
from storage.keys import FileKeyStore


def _node(name: str, now: list[float]) -> tuple[ClusterState, ApiKeyTable]:
    state = ClusterState(name)
    return state, ApiKeyTable(state, clock=lambda: now[0])


def _sync(a: ClusterState, b: ClusterState) -> None:
    """One push-pull both ways (what the mesh does)."""
    b.merge_remote_state(a.local_state(False), False)
    a.merge_remote_state(b.local_state(False), False)


async def test_keys_written_through_are_loaded_by_a_node_that_starts_empty(tmp_path: Path) -> None:
    now = [1000.0]
    store = FileKeyStore(tmp_path / "keys.json")
    _, table = _node("a", now)
    keys = DurableKeys(table, store)
    await keys.load()  # nothing stored yet
    live_text, live = await keys.create(tenant="acme", role="user", name="ci")
    gone_text, gone = await keys.create(tenant="acme", role="reader")
    now[0] = 1100.0
    assert await keys.revoke(gone.key_id) is not None
    assert live_text.split("-", 2)[2] not in (tmp_path / "keys.json").read_text()  # never the secret

    _, fresh = _node("a", now)  # every node restarted: an empty table
    await DurableKeys(fresh, FileKeyStore(tmp_path / "keys.json")).load()
    auth = ApiKeyAuthenticator(fresh.get, clock=lambda: now[0])
    identity = auth.authenticate(live_text)
    assert isinstance(identity, Identity) and (identity.tenant, identity.role) == ("acme", "user")
    assert auth.authenticate(gone_text) == AuthFailure("revoked", gone.key_id)
    assert fresh.get(gone.key_id).revoked_at == 1100.0  # type: ignore[union-attr]
    assert fresh.get(live.key_id) == live


async def test_every_change_a_node_sees_reaches_its_own_store(tmp_path: Path) -> None:
    now = [1000.0]
    state_a, table_a = _node("a", now)
    state_b, table_b = _node("b", now)
    keys_b = DurableKeys(table_b, FileKeyStore(tmp_path / "b.json"))
    await keys_b.load()
    _, made = table_a.create(tenant="acme", role="user")  # made on a node without a store
    _sync(state_a, state_b)
    await keys_b.flush()
    stored = json.loads((tmp_path / "b.json").read_text())["keys"]
    assert [k["id"] for k in stored] == [made.key_id]
    table_a.revoke(made.key_id)
    _sync(state_a, state_b)
    await keys_b.flush()
    assert json.loads((tmp_path / "b.json").read_text())["keys"][0]["revoked_at"] == 1000.0


async def test_a_stale_live_copy_never_revives_a_revoked_key(tmp_path: Path) -> None:
    """Node c restarts from an old keys file (the key live) into a cluster that revoked it meanwhile: c's
    live write is newer by the clock, yet the key ends revoked on every node, and in c's file."""
    now = [1000.0]
    state_a, table_a = _node("a", now)
    text, record = table_a.create(tenant="acme", role="user")
    old = tmp_path / "c.json"
    await FileKeyStore(old).put_keys([stored(record)])  # what c wrote before it went down
    now[0] = 1100.0
    table_a.revoke(record.key_id)

    now[0] = 1200.0  # c starts later: its load writes the live copy with a newer clock than the revocation
    state_c, table_c = _node("c", now)
    keys_c = DurableKeys(table_c, FileKeyStore(old))
    await keys_c.load()
    assert table_c.get(record.key_id).revoked_at == 0  # type: ignore[union-attr]
    _sync(state_c, state_a)  # a sees the live copy, keeps the key revoked and writes the revocation again
    _sync(state_a, state_c)
    for table in (table_a, table_c):
        assert table.get(record.key_id).revoked_at == 1100.0  # type: ignore[union-attr]
        auth = ApiKeyAuthenticator(table.get, clock=lambda: now[0])
        assert auth.authenticate(text) == AuthFailure("revoked", record.key_id)
    await keys_c.flush()
    assert json.loads(old.read_text())["keys"][0]["revoked_at"] == 1100.0


async def test_a_key_is_not_created_while_its_store_is_unwritable(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    _, table = _node("a", [1000.0])
    keys = DurableKeys(table, FileKeyStore(blocker / "keys.json"))
    with pytest.raises(StorageError):
        await keys.create(tenant="acme", role="user")
    assert table.records() == []
