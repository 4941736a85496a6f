"""The worker registry's admin API on real nodes in front of real simulated workers.

One node: POST/GET/DELETE /workers change what it routes to, bad input is refused in the OpenAI envelope and
changes nothing. Two nodes in a mesh (one process): a worker added on one is routed to by the other, a
removal likewise, and one node's broken link to a worker does not take it out for the other.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from node.app import run_node
from node.cluster.config import ClusterConfig
from node.cluster.registry import worker_id
from node.errors import WorkerFailed
from node.sim.worker import SimWorker
from node.workers.client import WorkerClient
from node.workers.vllm_grpc import VllmGrpcClient
from tests.http.conftest import fast_sim, node_config


async def _call(method: str, url: str, **kw: Any) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s, s.request(method, url, **kw) as r:
        return r.status, await r.json()


async def _until(check: Callable[[], Awaitable[bool]], timeout_s: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def _chat(base: str, model: str) -> tuple[int, Any]:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    return await _call("POST", base + "/v1/chat/completions", json=body)


def _fast(config: Any, ports: list[int]) -> Any:
    workers = dataclasses.replace(config.workers, workers=tuple(f"grpc://127.0.0.1:{p}" for p in ports))
    return dataclasses.replace(config, workers=dataclasses.replace(workers, health_interval_s=0.1))


async def test_add_list_route_and_delete_workers(llama3_model_dir: Path) -> None:
    async with contextlib.AsyncExitStack() as stack:
        first = await stack.enter_async_context(SimWorker(fast_sim(llama3_model_dir)))
        second = await stack.enter_async_context(SimWorker(fast_sim(llama3_model_dir)))
        node = await stack.enter_async_context(
            run_node(_fast(node_config(llama3_model_dir, [first.port]), [first.port]))
        )
        model = node.model.name
        url2 = f"grpc://127.0.0.1:{second.port}"

        status, added = await _call("POST", node.url + "/workers", json={"url": url2, "labels": {"zone": "b"}})
        assert status == 201, added
        assert added["id"] == worker_id(url2) and added["role"] == "regular" and added["labels"] == {"zone": "b"}
        status, again = await _call("POST", node.url + "/workers", json={"url": url2, "labels": {"zone": "c"}})
        assert status == 200 and again["labels"] == {"zone": "c"}, "re-adding updates in place"

        async def both_routable() -> bool:
            _, body = await _call("GET", node.url + "/workers")
            return [w["routable_here"] for w in body["data"]] == [True, True]

        await _until(both_routable)
        _, listing = await _call("GET", node.url + "/workers")
        by_url = {w["url"]: w for w in listing["data"]}
        assert set(by_url) == {f"grpc://127.0.0.1:{first.port}", url2}
        assert by_url[url2]["verdict"] == "healthy" and by_url[url2]["model"] == model
        assert by_url[url2]["load"]["running"] == 0 and 0 <= by_url[url2]["load"]["age_s"] < 5
        assert (
            list(by_url[url2]["observations"]) == [listing["node"]]
            and by_url[url2]["observations"][listing["node"]]["ok"]
        )

        for _ in range(6):  # round robin over both
            assert (await _chat(node.url, model))[0] == 200
        assert second.engine.completed_requests > 0, "the added worker never got traffic"

        status, deleted = await _call("DELETE", f"{node.url}/workers/{worker_id(url2)}")
        assert status == 200 and deleted == {"id": worker_id(url2), "object": "worker", "deleted": True}
        served = second.engine.completed_requests
        for _ in range(4):
            assert (await _chat(node.url, model))[0] == 200
        assert second.engine.completed_requests == served, "a removed worker still got traffic"
        status, err = await _call("DELETE", f"{node.url}/workers/{worker_id(url2)}")
        assert status == 404 and err["error"]["code"] == "not_found"
        status, err = await _call("GET", f"{node.url}/workers/w-nope")
        assert status == 404


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"url": "http://x:1"}, "url"),
        ({"url": "grpc://127.0.0.1"}, "url"),
        ({"url": "grpc://127.0.0.1:5", "role": "boss"}, "role"),
        ({"url": "grpc://127.0.0.1:5", "labels": {"k": 3}}, "labels"),
        ({"url": "grpc://127.0.0.1:5", "surprise": 1}, None),
        ({"nourl": 1}, None),
    ],
)
async def test_bad_worker_bodies_change_nothing(
    llama3_model_dir: Path, body: dict[str, Any], param: str | None
) -> None:
    async with contextlib.AsyncExitStack() as stack:
        sim = await stack.enter_async_context(SimWorker(fast_sim(llama3_model_dir)))
        node = await stack.enter_async_context(run_node(node_config(llama3_model_dir, [sim.port])))
        status, err = await _call("POST", node.url + "/workers", json=body)
        assert status == 400, err
        assert err["error"]["type"] == "invalid_request_error"
        if param is not None:
            assert str(err["error"]["param"]).startswith(param)
        _, listing = await _call("GET", node.url + "/workers")
        assert len(listing["data"]) == 1
        async with aiohttp.ClientSession() as s, s.post(node.url + "/workers", data=b"{not json") as r:
            assert r.status == 400


async def test_registration_checks_the_url_the_networks_and_the_worker_count(llama3_model_dir: Path) -> None:
    bad = [
        ("grpc://169.254.169.254:80", "outside the allowed worker networks"),
        ("grpc://[fd00:ec2::254]:80", "link-local or metadata"),  # ::/0 opens no denied range
        ("grpc://user:pw@10.0.0.1:5", "user information"),
        ("grpc://bad host:5", "spaces"),
        ("grpc://10.0.0.1:0", "port"),
        ("grpc://10.0.0.1:5/path", "path"),
        ("grpc://192.168.0.1:5", "outside the allowed worker networks"),
    ]
    async with contextlib.AsyncExitStack() as stack:
        sim = await stack.enter_async_context(SimWorker(fast_sim(llama3_model_dir)))
        config = node_config(llama3_model_dir, [sim.port])
        allowed = ("127.0.0.0/8", "10.0.0.0/8", "::/0")
        workers = dataclasses.replace(config.workers, max_workers=3, worker_allowed_networks=allowed)
        node = await stack.enter_async_context(run_node(dataclasses.replace(config, workers=workers)))
        for url, why in bad:
            status, err = await _call("POST", node.url + "/workers", json={"url": url})
            assert status == 400, (url, err)
            assert (err["error"]["type"], err["error"]["param"]) == ("invalid_request_error", "url")
            assert why in err["error"]["message"], (url, err)
        for port in (5, 6):  # up to max_workers (3) with the running one
            status, _ = await _call("POST", node.url + "/workers", json={"url": f"grpc://10.0.0.1:{port}"})
            assert status == 201
        status, err = await _call("POST", node.url + "/workers", json={"url": "grpc://10.0.0.1:7"})
        assert (status, err["error"]["param"]) == (400, "url")
        assert "already has 3 workers" in err["error"]["message"]
        status, _ = await _call("POST", node.url + "/workers", json={"url": "grpc://10.0.0.1:6", "model": "m"})
        assert status == 200  # updating a registered worker is not a new one
        _, listing = await _call("GET", node.url + "/workers")
        assert sorted(w["url"] for w in listing["data"]) == sorted(
            [f"grpc://127.0.0.1:{sim.port}", "grpc://10.0.0.1:5", "grpc://10.0.0.1:6"]
        )


class _BrokenLink:
    """A client whose health checks and requests to ``url`` fail, as if the network path were cut."""

    def __init__(self, blocked: set[str]) -> None:
        self.blocked = blocked

    def __call__(self, url: str) -> WorkerClient:
        real = VllmGrpcClient(url)
        if url not in self.blocked:
            return real
        return _Unreachable(real)  # type: ignore[return-value]


class _Unreachable:
    def __init__(self, real: VllmGrpcClient) -> None:
        self._real = real
        self.url = real.url

    async def health(self, timeout_s: float) -> bool:
        return False

    async def model_info(self, timeout_s: float) -> Any:
        raise WorkerFailed("unreachable")

    async def loads(self, timeout_s: float) -> Any:
        raise WorkerFailed("unreachable")

    def generate(self, request: Any) -> Any:
        raise WorkerFailed("unreachable")

    async def abort(self, request_ids: Any, timeout_s: float) -> None:
        return None

    async def connection_lost(self) -> None:
        await asyncio.Event().wait()  # cut: no connection comes up to be lost

    async def close(self) -> None:
        await self._real.close()


async def _workers(base: str) -> dict[str, Any]:
    _, body = await _call("GET", base + "/workers")
    return {w["url"]: w for w in body["data"]}


async def test_registry_and_health_are_shared_over_the_mesh(llama3_model_dir: Path) -> None:
    mesh = ClusterConfig(mesh_bind="127.0.0.1:0", mesh_profile="local", mesh_probe_interval_s=0.2)
    async with contextlib.AsyncExitStack() as stack:
        s1 = await stack.enter_async_context(SimWorker(fast_sim(llama3_model_dir)))
        s2 = await stack.enter_async_context(SimWorker(fast_sim(llama3_model_dir)))
        url1, url2 = f"grpc://127.0.0.1:{s1.port}", f"grpc://127.0.0.1:{s2.port}"
        base = dataclasses.replace(_fast(node_config(llama3_model_dir, [s1.port]), [s1.port]), cluster=mesh)
        a = await stack.enter_async_context(run_node(base, client_factory=_BrokenLink({url2})))
        assert a.mesh is not None
        # b starts with no --worker at all and learns both from the cluster.
        b_config = dataclasses.replace(
            base,
            workers=dataclasses.replace(base.workers, workers=()),
            cluster=dataclasses.replace(mesh, join=(a.mesh.addr,)),
        )
        b = await stack.enter_async_context(run_node(b_config))
        await _until(lambda: _has(b.url, {url1}))

        status, _ = await _call("POST", b.url + "/workers", json={"url": url2})
        assert status == 201
        await _until(lambda: _has(a.url, {url1, url2}))

        async def verdicts() -> bool:
            wa, wb = await _workers(a.url), await _workers(b.url)
            return (
                wa[url2]["verdict"] == "healthy"
                and wb[url2]["verdict"] == "healthy"
                and not wa[url2]["routable_here"]
                and wb[url2]["routable_here"]
                and len(wa[url2]["observations"]) == 2
            )

        # a cannot reach url2, b can: the cluster keeps it, only a routes around it.
        await _until(verdicts)
        wa = await _workers(a.url)
        obs = wa[url2]["observations"]
        assert obs[a.mesh.name]["ok"] is False and obs[b.mesh.name]["ok"] is True  # type: ignore[union-attr]
        model = a.model.name
        before = s2.engine.completed_requests
        for _ in range(4):
            assert (await _chat(a.url, model))[0] == 200
        assert s2.engine.completed_requests == before, "a routed to a worker it cannot reach"
        for _ in range(4):
            assert (await _chat(b.url, model))[0] == 200
        assert s2.engine.completed_requests > before, "b should route to the worker it can reach"

        # A removal on a reaches b.
        status, _ = await _call("DELETE", f"{a.url}/workers/{worker_id(url2)}")
        assert status == 200
        await _until(lambda: _has(b.url, {url1}))


async def _has(base: str, urls: set[str]) -> bool:
    return set(await _workers(base)) == urls


async def test_loads_stay_fresh_when_the_kv_event_stream_carries_none(llama3_model_dir: Path) -> None:
    """The simulated engine's KV-event stream has no load records: polls must go on, or the load freezes."""
    from node.routing.config import RoutingConfig

    async with contextlib.AsyncExitStack() as stack:
        sim = await stack.enter_async_context(SimWorker(fast_sim(llama3_model_dir, tpot_ms=50.0)))
        config = node_config(llama3_model_dir, [sim.port], RoutingConfig(policy="cache_aware"))
        node = await stack.enter_async_context(run_node(_fast(config, [sim.port])))

        async def streaming() -> bool:
            return (await _workers(node.url))[f"grpc://127.0.0.1:{sim.port}"]["kv_events"] == "streaming"

        warm = {"model": node.model.name, "messages": [{"role": "user", "content": "cache me " * 20}], "max_tokens": 1}
        assert (await _call("POST", node.url + "/v1/chat/completions", json=warm))[0] == 200  # blocks stored: events
        await _until(streaming)
        body = {"model": node.model.name, "messages": [{"role": "user", "content": "x"}], "max_tokens": 60}
        body["ignore_eos"] = True  # type: ignore[assignment]
        busy = asyncio.create_task(_call("POST", node.url + "/v1/chat/completions", json=body))

        async def running() -> bool:
            load = (await _workers(node.url))[f"grpc://127.0.0.1:{sim.port}"]["load"]
            return load is not None and load["running"] == 1

        await _until(running, timeout_s=2.5)  # 60 tokens at 50 ms: the request runs ~3 s
        assert (await busy)[0] == 200
