"""Graceful drain with real processes: SIGTERM to a serving node mid-stream, as an orchestrator sends it."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
import urllib.request
from pathlib import Path

from tests.procs import SMG_NODE, free_port, http_status, port_open, process, wait_until


def _members(url: str) -> dict[str, str]:
    with urllib.request.urlopen(url + "/mesh/members", timeout=5) as resp:
        return {m["name"]: m["state"] for m in json.loads(resp.read())["members"]}


def _stream(url: str, max_tokens: int, chunks: list[str], first: threading.Event, errors: list[str]) -> None:
    body = {
        "model": "llama3",
        "messages": [{"role": "user", "content": "Tell me a long story"}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    req = urllib.request.Request(
        url + "/v1/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            for raw in resp:
                line = raw.decode().strip()
                if line.startswith("data: "):
                    chunks.append(line[6:])
                    first.set()
    except Exception as exc:
        errors.append(repr(exc))
    finally:
        first.set()


def test_sigterm_drains_in_flight_stream_refuses_new_and_leaves_the_mesh(
    llama3_model_dir: Path, tmp_path: Path
) -> None:
    sim_port, a_http, b_http, a_mesh, b_mesh = (free_port() for _ in range(5))
    model = ["--model-path", str(llama3_model_dir)]
    sim = [*SMG_NODE, "sim-worker", "--port", str(sim_port), *model, "--tpot-ms", "10", "--ttft-base-ms", "1"]
    common = [*model, "--worker", f"grpc://127.0.0.1:{sim_port}", "--mesh-profile", "local", "--drain-timeout-s", "20"]
    node_a = [*SMG_NODE, "serve", "--port", str(a_http), "--mesh-bind", f"127.0.0.1:{a_mesh}", *common]
    node_b = [*SMG_NODE, "serve", "--port", str(b_http), "--mesh-bind", f"127.0.0.1:{b_mesh}", *common]
    node_b += ["--join", f"127.0.0.1:{a_mesh}"]
    a_url, b_url = f"http://127.0.0.1:{a_http}", f"http://127.0.0.1:{b_http}"
    with (
        process(sim, log=tmp_path / "sim.log"),
        process(node_a, log=tmp_path / "a.log") as a,
        process(node_b, log=tmp_path / "b.log"),
    ):
        for url in (a_url, b_url):
            wait_until(lambda url=url: http_status(url + "/readiness") == 200, timeout_s=30, what="readiness")
        wait_until(lambda: len(_members(b_url)) == 2, timeout_s=15, what="the two nodes to mesh")

        # 400 tokens at 10 ms each: the stream runs ~4 s, well past the moment SIGTERM arrives.
        chunks: list[str] = []
        errors: list[str] = []
        first = threading.Event()
        reader = threading.Thread(target=_stream, args=(a_url, 400, chunks, first, errors), daemon=True)
        reader.start()
        assert first.wait(15), "the stream never started"
        signalled = time.monotonic()
        os.kill(a.pid, signal.SIGTERM)

        # Readiness flips at once: 503 (draining) or, once the listener has closed, no answer at all.
        wait_until(lambda: http_status(a_url + "/readiness") != 200, timeout_s=0.5, what="readiness to flip")
        # Peers see a graceful departure, not a failure.
        wait_until(
            lambda: any(state == "left" for state in _members(b_url).values()), timeout_s=5, what="LEFT on the peer"
        )
        # New connections are refused while the stream is still being served.
        wait_until(lambda: not port_open(a_http), timeout_s=5, what="the listener to close")
        assert reader.is_alive(), "the stream should still be running while the node refuses new connections"
        with socket.socket() as s:
            s.settimeout(1)
            assert s.connect_ex(("127.0.0.1", a_http)) != 0

        reader.join(30)
        assert not errors, errors
        assert chunks[-1] == "[DONE]", "the in-flight stream was cut"
        # Tokens, from the usage chunk: a delta carries every token that reached the node together.
        assert json.loads(chunks[-2])["usage"]["completion_tokens"] == 400, "the in-flight stream ended early"
        assert a.wait(timeout=25) == 0, "a drained node exits 0"
        assert time.monotonic() - signalled < 20, "it exits once the stream is done, not at the drain timeout"
        # The other node serves on, alone.
        assert http_status(b_url + "/readiness") == 200
