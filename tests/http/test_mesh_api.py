"""Two nodes with a mesh, in one process: POST /mesh/join, GET /mesh/members, mesh metrics, graceful leave."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from node.app import run_node
from node.cluster.config import ClusterConfig
from node.sim.worker import SimWorker
from tests.http.conftest import fast_sim, node_config


async def _get(url: str) -> Any:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        return await r.json() if r.content_type == "application/json" else await r.text()


async def _states(url: str) -> dict[str, str]:
    body = await _get(url + "/mesh/members")
    return {m["name"]: m["state"] for m in body["members"]}


async def _until(check: Any, timeout_s: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.1)


async def test_join_members_metrics_and_leave(llama3_model_dir: Path) -> None:
    mesh = ClusterConfig(mesh_bind="127.0.0.1:0", mesh_profile="local", mesh_probe_interval_s=0.2)
    async with contextlib.AsyncExitStack() as stack:
        sim = await stack.enter_async_context(SimWorker(fast_sim(llama3_model_dir)))
        base = node_config(llama3_model_dir, [sim.port])
        # a publishes roles (--mesh-role zone=eu-1 --mesh-role prefill); b publishes none.
        roles = dataclasses.replace(mesh, mesh_roles=("zone=eu-1", "prefill"))
        a = await stack.enter_async_context(run_node(dataclasses.replace(base, cluster=roles)))
        b_stack = contextlib.AsyncExitStack()
        b = await b_stack.enter_async_context(run_node(dataclasses.replace(base, cluster=mesh)))
        assert a.mesh is not None and b.mesh is not None
        b_name = b.mesh.name
        try:
            async with aiohttp.ClientSession() as s:
                async with s.post(b.url + "/mesh/join", json={"peers": [a.mesh.addr]}) as r:
                    assert r.status == 200, await r.text()
                    assert (await r.json())["joined"] == 1
                async with s.post(b.url + "/mesh/join", json={"peers": ["not an address"]}) as r:
                    assert r.status == 400 and (await r.json())["error"]["param"] == "peers[0]"
            for url in (a.url, b.url):
                await _until(lambda url=url: _alive_both(url, a.mesh.name, b.mesh.name))  # type: ignore[union-attr]
            members = (await _get(a.url + "/mesh/members"))["members"]
            assert {m["http_addr"] for m in members} == {a.url.removeprefix("http://"), b.url.removeprefix("http://")}
            # Both nodes list a's roles (b learnt them by gossip, with the HTTP address published after binding).
            for url in (a.url, b.url):
                listed = {m["name"]: m["roles"] for m in (await _get(url + "/mesh/members"))["members"]}
                assert listed == {a.mesh.name: {"zone": "eu-1", "prefill": ""}, b_name: {}}, listed
            metrics = await _get(a.url + "/metrics")
            assert 'smg_node_mesh_members{state="alive"} 2.0' in metrics
            assert "smg_node_mesh_probes_sent_total" in metrics
        finally:
            await b_stack.aclose()  # b shuts down: it leaves gracefully
        await _until(lambda: _is(a.url, b_name, "left"))


async def _alive_both(url: str, x: str, y: str) -> bool:
    states = await _states(url)
    return states.get(x) == "alive" and states.get(y) == "alive"


async def _is(url: str, name: str, state: str) -> bool:
    return (await _states(url)).get(name) == state


@pytest.mark.parametrize("path", ["/mesh/members"])
async def test_no_mesh_no_routes(llama3_model_dir: Path, path: str) -> None:
    async with (
        SimWorker(fast_sim(llama3_model_dir)) as sim,
        run_node(node_config(llama3_model_dir, [sim.port])) as n,
        aiohttp.ClientSession() as s,
        s.get(n.url + path) as r,
    ):
        assert r.status == 404
