"""The operators' status page: GET / and /status.json on a real 3-node mesh, `smg-node status` as tables, and
the page itself in headless Chromium, updating when a worker dies (its sim process killed -9)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from node.app import RunningNode, run_node
from node.auth.config import AuthConfig
from node.auth.keys import new_key
from node.cluster.config import ClusterConfig
from node.sim.worker import SimWorker
from tests.http.conftest import fast_sim, node_config
from tests.procs import REPO, SMG_NODE, free_port, port_open

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


async def _until(check: Any, timeout_s: float = 20.0, what: str = "") -> Any:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        result = await check()
        if result:
            return result
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


async def _json(url: str) -> Any:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        assert r.status == 200, await r.text()
        return await r.json()


@dataclasses.dataclass
class Mesh3:
    nodes: list[RunningNode]
    worker_url: str
    sim: asyncio.subprocess.Process


@contextlib.asynccontextmanager
async def three_nodes(model_dir: Path, log: Path) -> AsyncIterator[Mesh3]:
    """Three meshed nodes in this process and one sim worker in its own (so it can be killed -9)."""
    port = free_port()
    with log.open("wb") as out:
        sim = await asyncio.create_subprocess_exec(
            *SMG_NODE, "sim-worker", "--port", str(port), "--model-path", str(model_dir), "--tpot-ms", "1",
            cwd=REPO, stdout=out, stderr=out,
        )  # fmt: skip
    try:
        await _until(lambda: asyncio.to_thread(port_open, port), 30, "the sim worker")
        mesh = ClusterConfig(mesh_bind="127.0.0.1:0", mesh_profile="local", mesh_probe_interval_s=0.2)
        base = dataclasses.replace(node_config(model_dir, [port]), cluster=mesh)
        async with contextlib.AsyncExitStack() as stack:
            nodes = [await stack.enter_async_context(run_node(base)) for _ in range(3)]
            seed = nodes[0].mesh
            assert seed is not None
            async with aiohttp.ClientSession() as s:
                for node in nodes[1:]:
                    async with s.post(node.url + "/mesh/join", json={"peers": [seed.addr]}) as r:
                        assert r.status == 200, await r.text()

            async def meshed() -> bool:
                states = [[m["state"] for m in (await _json(n.url + "/status.json"))["members"]] for n in nodes]
                return all(s == ["alive"] * 3 for s in states)

            await _until(meshed, 20, "three alive members on every node")
            yield Mesh3(nodes=nodes, worker_url=f"grpc://127.0.0.1:{port}", sim=sim)
    finally:
        if sim.returncode is None:
            sim.kill()
        await sim.wait()


async def test_status_json_and_cli_tables(llama3_model_dir: Path, tmp_path: Path) -> None:
    async with three_nodes(llama3_model_dir, tmp_path / "sim.log") as m:
        node = m.nodes[1]
        async with aiohttp.ClientSession() as s:
            async with s.post(
                node.url + "/v1/completions", json={"model": "llama3", "prompt": "Hello there", "max_tokens": 3}
            ) as r:
                assert r.status == 200
            for path in ("/", "/status"):
                async with s.get(node.url + path) as r:
                    assert r.status == 200 and r.content_type == "text/html"
                    assert "status.json" in await r.text()
        status = await _json(node.url + "/status.json")
        assert {mem["http_addr"] for mem in status["members"]} == {n.url.removeprefix("http://") for n in m.nodes}
        (worker,) = status["workers"]
        assert worker["url"] == m.worker_url and worker["verdict"] == "healthy" and worker["circuit"] == "closed"
        assert worker["requests"] == 1 and worker["cache_hit_ratio"] is not None
        assert status["models"] == [{"id": "llama3", "servable": True}]
        assert status["requests"]["by_class"]["2xx"] >= 1
        assert 0 < status["rate_limits"]["share"] <= 1.0 and status["rate_limits"]["refused"]["requests"] == 0

        done = await asyncio.to_thread(
            subprocess.run, [*SMG_NODE, "status", "--node", node.url], capture_output=True, text=True, cwd=REPO,
            timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert lines[0].startswith("node ") and "ready: yes" in lines[0]
        assert sum(1 for line in lines if line.endswith("alive") or " alive " in line) == 3
        worker_line = next(line for line in lines if line.startswith(m.worker_url))
        assert worker_line.split()[3:6] == ["healthy", "yes", "closed"]
        assert "RATE LIMITS" in lines

        m.sim.send_signal(signal.SIGKILL)

        async def unhealthy() -> bool:
            (w,) = (await _json(node.url + "/status.json"))["workers"]
            return bool(w["verdict"] == "unhealthy" and not w["routable_here"])

        await _until(unhealthy, 10, "the dead worker shown unhealthy")


class DevTools:
    """Just enough of the Chrome DevTools Protocol: evaluate an expression in the page."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._id = 0

    async def eval(self, expression: str) -> Any:
        self._id += 1
        await self._ws.send_json(
            {"id": self._id, "method": "Runtime.evaluate", "params": {"expression": expression, "returnByValue": True}}
        )
        while True:
            msg = await asyncio.wait_for(self._ws.receive_json(), 10)
            if msg.get("id") == self._id:
                return msg["result"]["result"].get("value")


@contextlib.asynccontextmanager
async def chromium_page(url: str, profile: Path) -> AsyncIterator[DevTools]:
    assert CHROMIUM is not None
    args = [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions"]
    args += ["--remote-debugging-port=0", f"--user-data-dir={profile}", url]
    proc = await asyncio.create_subprocess_exec(*args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file = profile / "DevToolsActivePort"
        await _until(lambda: asyncio.sleep(0, port_file.exists() and port_file.read_text().strip()), 30, "Chromium")
        port = int(port_file.read_text().splitlines()[0])
        async with aiohttp.ClientSession() as s:
            targets = await _until(lambda: _page_targets(s, port), 20, "Chromium's page target")
            async with s.ws_connect(targets[0]["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                yield DevTools(ws)
    finally:
        proc.kill()
        await proc.wait()


async def _page_targets(s: aiohttp.ClientSession, port: int) -> list[dict[str, Any]]:
    async with s.get(f"http://127.0.0.1:{port}/json/list") as r:
        return [t for t in await r.json() if t.get("type") == "page"]


_ROWS = """JSON.stringify(Object.fromEntries(["members", "workers"].map((id) => [id,
  [...document.querySelectorAll("#" + id + " tbody tr")].map((tr) => [...tr.cells].map((c) => c.textContent))])))"""


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium package is not installed (scripts/check installs it)")
async def test_page_in_chromium_shows_the_mesh_and_a_worker_dying(llama3_model_dir: Path, tmp_path: Path) -> None:
    async with three_nodes(llama3_model_dir, tmp_path / "sim.log") as m:
        node = m.nodes[2]
        async with chromium_page(node.url + "/", tmp_path / "profile") as page:

            async def rows() -> dict[str, list[list[str]]]:
                text = await page.eval(_ROWS)
                return json.loads(text) if text else {}

            async def shows_cluster() -> bool:
                r = await rows()
                members, workers = r.get("members", []), r.get("workers", [])
                return (
                    {row[2] for row in members} == {n.url.removeprefix("http://") for n in m.nodes}
                    and all(row[3] == "alive" for row in members)
                    and [w[0] for w in workers] == [m.worker_url]
                    and workers[0][3] == "healthy"
                )

            await _until(shows_cluster, 30, "the page to show 3 alive members and the healthy worker")
            loaded = await page.eval("performance.timeOrigin")
            m.sim.send_signal(signal.SIGKILL)

            async def shows_dead_worker() -> bool:
                workers = (await rows()).get("workers", [])
                return bool(workers) and workers[0][3] == "unhealthy" and workers[0][4] == "no"

            await _until(shows_dead_worker, 20, "the page to show the worker unhealthy")
            assert await page.eval("performance.timeOrigin") == loaded, "the same page updated itself (no reload)"


_LOGIN = """JSON.stringify({auth: document.body.dataset.auth || "", error: document.getElementById("error").textContent,
  asks: !document.getElementById("login").hidden, stored: sessionStorage.getItem("smg-node-status-key"),
  workers: [...document.querySelectorAll("#workers tbody tr")].map((tr) => [...tr.cells].map((c) => c.textContent))})"""


_CLICK_METRICS = 'document.getElementById("metrics-link").click(); true'
_METRICS = """JSON.stringify({state: document.body.dataset.metrics || "", path: location.pathname,
  shown: !document.getElementById("metrics-view").hidden, text: document.getElementById("metrics-text").textContent})"""


def _submit(key: str) -> str:
    return f"""document.getElementById("key").value = {json.dumps(key)};
      document.getElementById("login").requestSubmit(); true"""


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium package is not installed (scripts/check installs it)")
async def test_page_asks_for_a_reader_key_on_a_node_that_requires_keys(llama3_model_dir: Path, tmp_path: Path) -> None:
    """A node with keys on: the page loads without credentials, asks for a key, explains a refused key (401)
    and a key of the wrong role (403), then shows the cluster with a reader key made by `smg-node keys create`,
    and keeps it for the tab (a reload does not ask again)."""
    bootstrap, _ = new_key()
    async with contextlib.AsyncExitStack() as stack:
        sim = await stack.enter_async_context(SimWorker(fast_sim(llama3_model_dir)))
        config = dataclasses.replace(
            node_config(llama3_model_dir, [sim.port]), auth=AuthConfig(auth_bootstrap_key=bootstrap)
        )
        node = await stack.enter_async_context(run_node(config))
        created = await asyncio.to_thread(
            subprocess.run, [*SMG_NODE, "keys", "create", "--role", "reader", "--name", "ops", "--node", node.url],
            capture_output=True, text=True, cwd=REPO, timeout=60, check=False,
            env={**os.environ, "SMG_NODE_API_KEY": bootstrap},
        )  # fmt: skip
        assert created.returncode == 0, created.stderr
        reader = created.stdout.split()[0]
        async with aiohttp.ClientSession() as s:
            async with s.get(node.url + "/") as r:
                assert r.status == 200 and r.content_type == "text/html"  # the page itself holds no data
            async with s.get(node.url + "/status.json") as r:
                assert r.status == 401
            headers = {"Authorization": f"Bearer {bootstrap}"}
            async with s.post(node.url + "/admin/keys", json={"role": "user"}, headers=headers) as r:
                assert r.status == 201
                user = (await r.json())["key"]

        async with chromium_page(node.url + "/", tmp_path / "profile") as page:

            async def state() -> dict[str, Any]:
                text = await page.eval(_LOGIN)
                return json.loads(text) if text else {}

            async def shows(auth: str) -> dict[str, Any] | None:
                now = await state()
                return now if now.get("auth") == auth else None

            asked = await _until(lambda: shows("401"), 30, "the page to ask for a key")
            assert asked["asks"] and "requires an API key" in asked["error"] and asked["workers"] == []
            # Without a key the /metrics link does not lead to a bare 401: the page asks for the key.
            await page.eval(_CLICK_METRICS)
            assert "/metrics needs a reader" in (await state())["error"]
            assert await page.eval("location.pathname") == "/"

            await page.eval(_submit(user))
            refused = await _until(lambda: shows("403"), 20, "the page to refuse a user key")
            assert refused["asks"] and "reader or admin role" in refused["error"] and refused["workers"] == []

            await page.eval(_submit("smg-nosuchkey-" + "x" * 32))
            unknown = await _until(lambda: shows("401"), 20, "the page to refuse an unknown key")
            assert "refused this key" in unknown["error"] and unknown["stored"] is None

            await page.eval(_submit(reader))

            async def shows_worker() -> dict[str, Any] | None:
                now = await shows("ok")
                return now if now and now["workers"] and now["workers"][0][3] == "healthy" else None

            shown = await _until(shows_worker, 20, "the page to show the worker with the reader key")
            assert not shown["asks"] and shown["error"] == "" and shown["stored"] == reader
            assert shown["workers"][0][0] == f"grpc://127.0.0.1:{sim.port}"

            # The /metrics link: a browser cannot send the key with a plain link (the bare GET is 401), so the
            # page fetches it with the tab's key and shows the text, staying on the page.
            async with aiohttp.ClientSession() as s, s.get(node.url + "/metrics") as r:
                assert r.status == 401
            await page.eval(_CLICK_METRICS)

            async def shows_metrics() -> dict[str, Any] | None:
                text = await page.eval(_METRICS)
                now = json.loads(text) if text else {}
                return now if now.get("state") == "ok" else None

            metrics = await _until(shows_metrics, 20, "the page to show /metrics with the reader key")
            assert metrics["shown"] and "smg_node_worker_healthy" in metrics["text"] and metrics["path"] == "/"

            loaded = await page.eval("performance.timeOrigin")
            await page.eval("location.reload(); true")

            async def reloaded() -> bool:
                with contextlib.suppress(TimeoutError, KeyError):  # the page may be between documents
                    return bool(await page.eval("performance.timeOrigin") != loaded)
                return False

            await _until(reloaded, 20, "the page to reload")
            again = await _until(shows_worker, 20, "the reloaded page to show the worker without asking")
            assert not again["asks"]
