"""API keys survive a full-cluster restart (node/cluster/key_store.py): 2 real meshed node processes keep
their keys in real Postgres, in real Redis, or each in its own --keys-file; a key is created on one node and
another revoked, every node is killed (-9: what was answered must already be durable), all start again, and
the key works on every node while the revoked one stays refused."""

from __future__ import annotations

import asyncio
import functools
import json
import stat
import uuid
from pathlib import Path

import aiohttp
import pytest

from bench.auth_real import keyed_cluster_of
from chaos.cluster import Node, wait_until
from tests.storage.conftest import PG_URL, REDIS_URL, delete_keys, drop_tables

NODES = 2


async def _status(url: str, key: str) -> int:
    async with (
        aiohttp.ClientSession() as session,
        session.get(url + "/v1/models", headers={"Authorization": f"Bearer {key}"}) as r,
    ):
        return r.status


async def _admin(method: str, url: str, admin: str, body: object = None) -> dict[str, object]:
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, url, json=body, headers={"Authorization": f"Bearer {admin}"}) as r,
    ):
        assert r.status in (200, 201), await r.text()
        answer: dict[str, object] = await r.json()
        return answer


def _holds(path: Path, want: dict[str, bool]) -> bool:
    """Whether the keys file holds exactly ``want`` (key id -> revoked)."""
    if not path.exists():
        return False
    return {k["id"]: k["revoked_at"] > 0 for k in json.loads(path.read_text())["keys"]} == want


def _flags(backend: str, workdir: Path) -> tuple[str, object]:
    """(a per-node flags function, what to clean up)."""
    if backend == "postgres":
        prefix = f"k{uuid.uuid4().hex[:10]}_"
        url = PG_URL
        flags = ("--history-backend", "postgres", "--postgres-url", url, "--history-table-prefix", prefix)
        return lambda _name: flags, (url, prefix)  # type: ignore[return-value]
    if backend == "redis":
        prefix = f"k{uuid.uuid4().hex[:10]}"
        url = REDIS_URL
        flags = ("--history-backend", "redis", "--redis-url", url, "--history-key-prefix", prefix)
        return lambda _name: flags, (url, prefix)  # type: ignore[return-value]
    return lambda name: ("--keys-file", str(workdir / f"{name}.keys.json")), None  # type: ignore[return-value]


@pytest.mark.parametrize("backend", ["postgres", "redis", "file"])
def test_keys_survive_a_restart_of_every_node(backend: str, tmp_path: Path) -> None:
    flags, cleanup = _flags(backend, tmp_path)
    try:
        with keyed_cluster_of(tmp_path, NODES, extra=flags) as (cluster, admin):  # type: ignore[arg-type]
            nodes: list[Node] = list(cluster.nodes.values())
            first, last = nodes[0], nodes[-1]
            kept = asyncio.run(_admin("POST", first.url + "/admin/keys", admin, {"tenant": "acme", "role": "user"}))
            gone = asyncio.run(_admin("POST", last.url + "/admin/keys", admin, {"tenant": "acme", "role": "user"}))
            asyncio.run(_admin("DELETE", f"{last.url}/admin/keys/{gone['id']}", admin))
            if backend == "file":  # every node writes the whole cluster's keys to its own file
                for node in nodes:
                    path = tmp_path / f"{node.name}.keys.json"
                    want = {str(kept["id"]): False, str(gone["id"]): True}
                    wait_until(functools.partial(_holds, path, want), timeout_s=10, what=f"{node.name}'s keys file")
                    assert stat.S_IMODE(path.stat().st_mode) == 0o600
                    assert str(kept["key"]).split("-", 2)[2] not in path.read_text()
            for node in nodes:
                cluster.kill(node)

            cluster.start(*nodes)
            cluster.wait_up(*nodes)
            for node in nodes:
                assert asyncio.run(_status(node.url, str(kept["key"]))) == 200, cluster.tail(node)
                assert asyncio.run(_status(node.url, str(gone["key"]))) == 401
            listed = asyncio.run(_admin("GET", last.url + "/admin/keys", admin))["data"]
            revoked = {k["id"]: k["revoked_at"] for k in listed}  # type: ignore[attr-defined]
            assert revoked[kept["id"]] is None and revoked[gone["id"]] is not None
    finally:
        if backend == "postgres":
            asyncio.run(drop_tables(*cleanup))  # type: ignore[misc]
        elif backend == "redis":
            asyncio.run(delete_keys(*cleanup))  # type: ignore[misc]
