"""The contract test: the reference gateway (SMG, `smg launch --backend vllm`) drives our simulated engine.

Both run as subprocesses: ``python -m node.sim`` on a free port (read from its start-up log line) and SMG
over gRPC in front of it; then OpenAI chat completions (plain and streamed) and a text completion go through.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

SMG = shutil.which("smg", path=str(Path(sys.executable).parent)) or shutil.which("smg")
pytestmark = [
    pytest.mark.smg,
    pytest.mark.skipif(SMG is None, reason="the reference gateway `smg` is not installed (pip install smg)"),
]

START_TIMEOUT_S = 60.0
REQUEST_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 5.0
_LISTENING = re.compile(r"serving .* on (\S+):(\d+)")


def free_ports(count: int) -> list[int]:
    """Distinct free ports (all probes stay open until each is chosen, so none repeats)."""
    probes = [socket.socket() for _ in range(count)]
    try:
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [int(probe.getsockname()[1]) for probe in probes]
    finally:
        for probe in probes:
            probe.close()


@contextmanager
def process(args: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as sink:
        proc = subprocess.Popen(args, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(STOP_TIMEOUT_S)


def read_log(log: Path, last_chars: int = 4000) -> str:
    return log.read_text(errors="replace")[-last_chars:]


async def wait_for_port(proc: subprocess.Popen[bytes], log: Path) -> int:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the simulated engine exited with {proc.returncode}:\n{read_log(log)}")
        match = _LISTENING.search(read_log(log, 100_000))
        if match:
            return int(match.group(2))
        await asyncio.sleep(0.05)
    pytest.fail(f"the simulated engine did not report its port within {START_TIMEOUT_S} s:\n{read_log(log)}")


async def wait_until_ready(http: aiohttp.ClientSession, base: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"smg exited with {proc.returncode}:\n{read_log(log)}")
        try:
            async with http.get(f"{base}/readiness") as response:
                if response.status == 200 and (await response.json()).get("status") == "ready":
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.2)
    pytest.fail(f"smg was not ready within {START_TIMEOUT_S} s:\n{read_log(log)}")


async def sse_events(response: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
    async for raw in response.content:
        line = raw.decode().strip()
        if not line.startswith("data:"):
            continue
        data = line.removeprefix("data:").strip()
        if data == "[DONE]":
            return
        yield json.loads(data)


async def test_smg_serves_openai_requests_from_the_sim(model_dir: Path, tmp_path: Path) -> None:
    assert SMG is not None
    sim_log, smg_log = tmp_path / "sim.log", tmp_path / "smg.log"
    sim_port, gateway_port = free_ports(2)
    sim_args = [sys.executable, "-m", "node.sim", "--model-path", str(model_dir), "--port", str(sim_port)]
    smg_args = [
        SMG,
        "launch",
        "--backend", "vllm",
        "--worker-urls", f"grpc://127.0.0.1:{sim_port}",
        "--model-path", str(model_dir),
        "--tokenizer-path", str(model_dir),
        "--host", "127.0.0.1",
        "--port", str(gateway_port),
        "--worker-startup-check-interval", "1",
    ]  # fmt: skip
    # Both start at once (each spends seconds loading the tokenizer); SMG retries until the engine is up.
    with process(sim_args, sim_log) as sim, process(smg_args, smg_log) as smg:
        assert await wait_for_port(sim, sim_log) == sim_port
        base = f"http://127.0.0.1:{gateway_port}"
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            await wait_until_ready(http, base, smg, smg_log)
            model = model_dir.name
            async with http.get(f"{base}/v1/models") as response:
                assert model in [m["id"] for m in (await response.json())["data"]]

            chat = {"model": model, "messages": [{"role": "user", "content": "Tell me about the sea."}]}
            async with http.post(f"{base}/v1/chat/completions", json=chat) as response:
                assert response.status == 200, await response.text()
                body = await response.json()
            choice = body["choices"][0]
            assert choice["message"]["content"].strip()
            assert choice["finish_reason"] == "stop"
            assert body["usage"]["prompt_tokens"] > 0
            assert body["usage"]["completion_tokens"] > 0

            streamed = {
                **chat,
                "stream": True,
                "stream_options": {"include_usage": True},
                "max_tokens": 12,
            }
            async with http.post(f"{base}/v1/chat/completions", json=streamed) as response:
                assert response.status == 200, await response.text()
                events = [event async for event in sse_events(response)]
            text = "".join(
                c["delta"].get("content") or "" for e in events for c in e.get("choices", []) if "delta" in c
            )
            finishes = [c["finish_reason"] for e in events for c in e.get("choices", []) if c.get("finish_reason")]
            usage = [e["usage"] for e in events if e.get("usage")]
            assert text.strip()
            assert finishes == ["length"]
            assert usage and usage[-1]["completion_tokens"] == 12

            completion = {"model": model, "prompt": "Once upon a time", "max_tokens": 16}
            async with http.post(f"{base}/v1/completions", json=completion) as response:
                assert response.status == 200, await response.text()
                body = await response.json()
            assert body["choices"][0]["text"].strip()
            assert body["choices"][0]["finish_reason"] == "length"
            assert body["usage"]["completion_tokens"] == 16
