"""Seeds by DNS name (node/cluster/seeds.py): resolved at join time, every address of a name, never our own; and
a node that joins by name, re-resolving on each round."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path

import pytest

from mesh.errors import JoinError
from node.cluster import member
from node.cluster.seeds import host_address, resolve_seeds
from tests.procs import SMG_NODE, free_port, http_status, process, wait_until


def _resolver(table: dict[str, list[str]]):  # type: ignore[no-untyped-def]
    async def resolve(host: str, port: int) -> list[str]:
        if host not in table:
            raise OSError(f"{host}: Name or service not known")
        return table[host]

    return resolve


def test_literal_addresses_pass_unchanged() -> None:
    got = asyncio.run(resolve_seeds(["10.0.0.1:7946", "[::1]:7946"], resolver=_resolver({})))
    assert got == ["10.0.0.1:7946", "[::1]:7946"]


def test_a_name_stands_for_every_replica_but_ourselves() -> None:
    table = {"node": ["172.18.0.4", "172.18.0.5", "172.18.0.6", "172.18.0.5"]}
    got = asyncio.run(resolve_seeds(["node:7946"], own="172.18.0.5:7946", resolver=_resolver(table)))
    assert got == ["172.18.0.4:7946", "172.18.0.6:7946"]


def test_a_name_that_does_not_resolve_yet_is_skipped_not_fatal() -> None:
    table = {"b": ["10.0.0.2"]}
    got = asyncio.run(resolve_seeds(["a:1", "b:2"], resolver=_resolver(table)))
    assert got == ["10.0.0.2:2"]


def test_malformed_seed_is_an_error() -> None:
    with pytest.raises(ValueError):
        asyncio.run(resolve_seeds(["no-port"], resolver=_resolver({})))


def test_a_wildcard_bind_advertises_the_address_of_its_host_name() -> None:
    table = {"me.example": ["10.1.2.3"]}
    assert asyncio.run(host_address("me.example", resolver=_resolver(table))) == "10.1.2.3"
    assert asyncio.run(host_address("10.9.9.9", resolver=_resolver(table))) == "10.9.9.9"
    with pytest.raises(OSError, match="does not resolve"):
        asyncio.run(host_address("gone.example", resolver=_resolver(table)))


class _FakeMesh:
    addr = "10.0.0.1:7946"

    def __init__(self) -> None:
        self.tried: list[list[str]] = []

    async def join(self, seeds: list[str]) -> int:
        self.tried.append(list(seeds))
        if "10.0.0.9:7946" in seeds:
            return 1
        raise JoinError("nobody answered")


def test_join_resolves_again_on_each_round(monkeypatch: pytest.MonkeyPatch) -> None:
    """A seed that comes back under a new address (a restarted container) is found on the next round."""
    answers = iter([["10.0.0.1", "10.0.0.2"], [], ["10.0.0.9"]])

    async def changing(host: str, port: int) -> list[str]:
        return next(answers)

    async def resolve(peers: list[str], *, own: str = "") -> list[str]:
        return await resolve_seeds(peers, own=own, resolver=changing)

    monkeypatch.setattr(member, "resolve_seeds", resolve)
    monkeypatch.setattr(member, "REJOIN_PAUSE_S", 0.01)
    mesh = _FakeMesh()
    asyncio.run(asyncio.wait_for(member._join_forever(mesh, ["node:7946"]), 5))  # type: ignore[arg-type]
    assert mesh.tried == [["10.0.0.2:7946"], ["10.0.0.9:7946"]], "own address skipped; empty round not joined"


def test_nodes_join_by_host_name(llama3_model_dir: Path, tmp_path: Path) -> None:
    a_http, b_http, a_mesh, b_mesh = (free_port() for _ in range(4))
    base = [*SMG_NODE, "serve", "--model-path", str(llama3_model_dir), "--mesh-profile", "local"]
    a = [*base, "--port", str(a_http), "--mesh-bind", f"127.0.0.1:{a_mesh}"]
    b = [*base, "--port", str(b_http), "--mesh-bind", f"127.0.0.1:{b_mesh}", "--join", f"localhost:{a_mesh}"]
    b_url = f"http://127.0.0.1:{b_http}"

    def members() -> int:
        with urllib.request.urlopen(b_url + "/mesh/members", timeout=5) as resp:
            return sum(m["state"] == "alive" for m in json.loads(resp.read())["members"])

    with process(a, log=tmp_path / "a.log"), process(b, log=tmp_path / "b.log"):
        wait_until(lambda: http_status(b_url + "/health") == 200, timeout_s=30, what="node b")
        wait_until(lambda: members() == 2, timeout_s=15, what="b to join a by the name localhost")
