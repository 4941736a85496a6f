"""node/cluster/key_store.py and the key table's "revocations win": keys written through to a real key store
(the JSON file; Postgres and Redis in tests/storage/test_keys.py and the process test), loaded by a node that
starts empty, and a revoked key never brought back by a stale copy."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from pathlib import Path

import aiohttp
import pytest

from mesh.state import ClusterState
from node.app import run_node
from node.auth.authenticator import ApiKeyAuthenticator, AuthFailure
from node.auth.config import AuthConfig
from node.auth.identity import Identity
from node.auth.keys import new_key
from node.cluster.api_keys import ApiKeyTable
from node.cluster.key_store import DurableKeys, stored
from node.sim.worker import SimWorker
from storage.config import StorageConfig
from storage.errors import StorageError
from storage.keys import FileKeyStore
from tests.http.conftest import fast_sim, node_config


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


async def test_the_admin_api_while_the_key_store_is_unwritable(llama3_model_dir: Path, tmp_path: Path) -> None:
    """A key is created only once stored (503 and no key while the store fails); a revocation bites at once
    even then (503 says it is not yet stored), and reaches the store when it is writable again."""
    state_dir = tmp_path / "state"
    state_dir.write_text("")  # a file where the keys file's directory should be: every write fails
    admin, _ = new_key()
    auth = {"Authorization": f"Bearer {admin}"}
    async with contextlib.AsyncExitStack() as stack:
        sim = await stack.enter_async_context(SimWorker(fast_sim(llama3_model_dir)))
        config = dataclasses.replace(
            node_config(llama3_model_dir, [sim.port]),
            auth=AuthConfig(auth_bootstrap_key=admin, keys_file=str(state_dir / "keys.json")),
        )
        node = await stack.enter_async_context(run_node(config))
        session = await stack.enter_async_context(aiohttp.ClientSession())
        body = {"tenant": "acme", "role": "user"}
        async with session.post(node.url + "/admin/keys", json=body, headers=auth) as r:
            assert r.status == 503 and (await r.json())["error"]["code"] == "key_store_unavailable"
        async with session.get(node.url + "/admin/keys", headers=auth) as r:
            assert (await r.json())["data"] == []

        state_dir.unlink()
        state_dir.mkdir()
        async with session.post(node.url + "/admin/keys", json=body, headers=auth) as r:
            assert r.status == 201
            made = await r.json()
        assert _revoked_in(state_dir / "keys.json") == {made["id"]: False}

        state_dir.rename(tmp_path / "moved")
        state_dir.write_text("")
        async with session.delete(f"{node.url}/admin/keys/{made['id']}", headers=auth) as r:
            assert r.status == 503
        async with session.get(node.url + "/v1/models", headers={"Authorization": f"Bearer {made['key']}"}) as r:
            assert r.status == 401  # revoked all the same
        state_dir.unlink()
        (tmp_path / "moved").rename(state_dir)
        for _ in range(100):  # the background writer retries every RETRY_S
            if _revoked_in(state_dir / "keys.json") == {made["id"]: True}:
                break
            await asyncio.sleep(0.1)
        assert _revoked_in(state_dir / "keys.json") == {made["id"]: True}


def _revoked_in(path: Path) -> dict[str, bool]:
    return {k["id"]: k["revoked_at"] > 0 for k in json.loads(path.read_text())["keys"]}


def test_a_keys_file_is_for_the_memory_backend_only(llama3_model_dir: Path) -> None:
    with pytest.raises(ValueError, match="kept in the postgres history backend"):
        dataclasses.replace(
            node_config(llama3_model_dir, []),
            storage=StorageConfig(backend="postgres"),
            auth=AuthConfig(keys_file="/tmp/keys.json"),
        )
