"""Workers by Kubernetes labels against a fake API server (an aiohttp app speaking the pods list and watch):
ready pods become workers with the model their label or annotation names, unready and deleted ones leave,
a 410 Gone relists, a failing API server changes nothing."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from node.app import run_node
from node.discovery.config import DiscoveryConfig
from node.discovery.kubernetes import pod_worker
from node.sim.worker import SimWorker
from tests.http.conftest import fast_sim, node_config


def pod(name: str, ip: str, *, ready: bool = True, labels: dict[str, str] | None = None, **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "labels": labels or {"app": "sim"}, **meta},
        "status": {
            "phase": "Running",
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


@dataclasses.dataclass
class FakeApi:
    pods: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    events: asyncio.Queue[dict[str, Any] | None] = dataclasses.field(default_factory=asyncio.Queue)
    version: int = 1
    lists: int = 0
    selectors: list[str] = dataclasses.field(default_factory=list)
    fail_lists: bool = False

    def emit(self, kind: str, obj: dict[str, Any]) -> None:
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        name = obj["metadata"]["name"]
        if kind == "DELETED":
            self.pods.pop(name, None)
        else:
            self.pods[name] = obj
        self.events.put_nowait({"type": kind, "object": obj})

    async def handle(self, request: web.Request) -> web.StreamResponse:
        assert request.match_info["ns"] == "inference"
        self.selectors.append(request.query["labelSelector"])
        if "watch" not in request.query:
            self.lists += 1
            if self.fail_lists:
                return web.Response(status=500)
            body = {"metadata": {"resourceVersion": str(self.version)}, "items": list(self.pods.values())}
            return web.json_response(body)
        resp = web.StreamResponse()
        await resp.prepare(request)
        while (event := await self.events.get()) is not None:
            await resp.write(json.dumps(event).encode() + b"\n")
        return resp


@contextlib.asynccontextmanager
async def fake_api(api: FakeApi) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_get("/api/v1/namespaces/{ns}/pods", api.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        api.events.put_nowait(None)
        await runner.cleanup()


async def _workers(url: str) -> dict[str, dict[str, Any]]:
    async with aiohttp.ClientSession() as s, s.get(url + "/workers") as r:
        return {w["url"]: w for w in (await r.json())["data"]}


async def _until(check: Any, timeout_s: float = 10.0, what: str = "") -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, f"timed out: {what}"
        await asyncio.sleep(0.05)


async def test_pods_follow_the_watch(llama3_model_dir: Path) -> None:
    api = FakeApi()
    async with SimWorker(fast_sim(llama3_model_dir)) as sim, fake_api(api) as api_url:
        port = sim.port
        api.pods["w1"] = pod("w1", "127.0.0.1", labels={"app": "sim", "smg.ai/model": "llama3"})
        api.pods["w2"] = pod("w2", "127.0.0.2", ready=False)
        discovery = DiscoveryConfig(
            worker_k8s_selector="app=sim", worker_k8s_namespace="inference", worker_k8s_port=port,
            worker_k8s_api_url=api_url,
        )  # fmt: skip
        config = dataclasses.replace(node_config(llama3_model_dir, []), discovery=discovery)
        w1, w2 = f"grpc://127.0.0.1:{port}", f"grpc://127.0.0.2:{port}"
        async with run_node(config) as node:

            async def has(urls: set[str]) -> bool:
                return set(await _workers(node.url)) == urls

            await _until(lambda: has({w1}), what="the ready pod registered")
            listed = (await _workers(node.url))[w1]
            assert listed["model"] == "llama3" and listed["labels"] == {"smg.discovery": "k8s:inference"}
            assert api.selectors[0] == "app=sim"

            api.emit("MODIFIED", pod("w2", "127.0.0.2", annotations={"smg.ai/model": "llama3"}))
            await _until(lambda: has({w1, w2}), what="the pod that became ready")
            assert (await _workers(node.url))[w2]["model"] == "llama3", "the model from an annotation"
            api.emit("MODIFIED", pod("w1", "127.0.0.1", ready=False))
            await _until(lambda: has({w2}), what="the pod that stopped being ready removed")
            api.emit("DELETED", pod("w2", "127.0.0.2"))
            await _until(lambda: has(set()), what="the deleted pod removed")

            # 410 Gone: the watch restarts from a fresh list, which finds the pod added meanwhile.
            api.pods["w1"] = pod("w1", "127.0.0.1")
            lists = api.lists
            api.events.put_nowait({"type": "ERROR", "object": {"code": 410, "message": "too old"}})
            await _until(lambda: has({w1}), what="the relist after 410")
            assert api.lists == lists + 1

            # The API server fails: nothing changes.
            api.fail_lists = True
            api.events.put_nowait(None)  # ends the watch: the next list fails
            await asyncio.sleep(1.0)
            assert await has({w1})


def test_what_makes_a_pod_a_worker() -> None:
    assert pod_worker(pod("a", "10.0.0.5"), 50051, "smg.ai/model") is not None
    assert pod_worker(pod("a", "10.0.0.5", ready=False), 50051, "m") is None
    assert pod_worker(pod("a", "10.0.0.5", deletionTimestamp="2026-01-01T00:00:00Z"), 50051, "m") is None
    assert pod_worker(pod("a", ""), 50051, "m") is None
    v6 = pod_worker(pod("a", "fd00::5", labels={"smg.ai/role": "prefill"}), 50051, "m")
    assert v6 is not None and v6.url == "grpc://[fd00::5]:50051" and v6.role == "prefill"
    odd = pod_worker(pod("a", "10.0.0.5", labels={"smg.ai/role": "boss"}), 50051, "m")
    assert odd is not None and odd.role == "regular"
