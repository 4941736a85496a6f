"""deploy/compose's `vllm` profile for real: the vLLM CPU engine image built from this tree, started beside the
docker tier's cluster, registered by `vllm-register`, and answering chat completions through the entry point.

Opt-in twice over (SMG_NODE_DOCKER_TESTS=1 and SMG_NODE_VLLM_COMPOSE=1), never in CI by default: the image is
~3.5 GiB and takes minutes to build. It runs last in the docker tier's session (the file sorts after
test_compose_cluster.py) because it recreates the nodes with the cache_aware policy and stops the simulated
workers, so that every request lands on the engine.

Where PyTorch's CPU index is unreachable, SMG_NODE_VLLM_WHEELS=DIR names a folder holding the
torch==2.13.0+cpu wheel; the test serves it to the build on the docker bridge's gateway address.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import os
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator

import pytest

from tests.deploy.cluster import COMPOSE_TIMEOUT_S, MODEL, Cluster, get_json
from tests.procs import wait_until

ENABLE_VAR = "SMG_NODE_VLLM_COMPOSE"
WHEELS_VAR = "SMG_NODE_VLLM_WHEELS"
IMAGE = "smg-node-vllm:local"
BUILD_TIMEOUT_S = 3600.0
# The engine serves 40-65 s after its start here; the image's health check allows 120 s + 60 x 5 s.
SERVE_TIMEOUT_S = 420.0
ENGINE_URL = "grpc://vllm:50051"
# Longer than two of the engine's 128-token KV blocks, so the repeat is served partly from its prefix cache.
LONG_PROMPT = " ".join(f"word{i}" for i in range(400))

pytestmark = [
    pytest.mark.docker,
    pytest.mark.timeout(5400),
    pytest.mark.skipif(os.environ.get(ENABLE_VAR) != "1", reason=f"the vllm compose profile: set {ENABLE_VAR}=1"),
]


def _report(line: str) -> None:
    print(f"\n[vllm profile] {line}", file=sys.stderr)


@contextlib.contextmanager
def _served(folder: str, host: str) -> Iterator[str]:
    """``folder`` over HTTP on ``host`` (an address build containers reach); yields its URL."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=folder)
    server = http.server.ThreadingHTTPServer((host, 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def _build_args(cluster: Cluster, stack: contextlib.ExitStack) -> list[str]:
    folder = os.environ.get(WHEELS_VAR)
    if not folder:
        return []
    # The default bridge's address on the host (its IPAM config may not name a gateway).
    fmt = '{{index .Options "com.docker.network.bridge.name"}}'
    bridge = cluster.run(["docker", "network", "inspect", "-f", fmt, "bridge"]).strip() or "docker0"
    addr = cluster.run(["ip", "-4", "-o", "addr", "show", "dev", bridge]).split()
    gateway = addr[addr.index("inet") + 1].partition("/")[0]
    url = stack.enter_context(_served(folder, gateway))
    return [
        *("--build-arg", "TORCH_INDEX="),
        *("--build-arg", f"PIP_FIND_LINKS={url}"),
        *("--build-arg", f"PIP_TRUSTED_HOST={gateway}"),
    ]


def _post(url: str, body: dict[str, object]) -> dict[str, object]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        result: dict[str, object] = json.loads(resp.read())
        return result


def _workers(url: str) -> dict[str, dict[str, object]]:
    data = get_json(url + "/workers")["data"]
    assert isinstance(data, list)
    return {str(w["url"]): w for w in data}


def _registered(url: str) -> bool:
    try:
        return ENGINE_URL in _workers(url)
    except (OSError, ValueError):  # a node being recreated behind the entry point
        return False


def _engine_only(cluster: Cluster) -> bool:
    """Every node routes to the engine alone, and follows its KV events."""
    for node in cluster.containers("node"):
        try:
            workers = _workers(cluster.node_url(node))
        except (OSError, ValueError):
            return False
        routable = {u for u, w in workers.items() if w["routable_here"]}
        engine = workers.get(ENGINE_URL)
        if routable != {ENGINE_URL} or engine is None or engine["kv_events"] != "streaming":
            return False
    return True


def _stream(url: str, prompt: str, max_tokens: int) -> tuple[int, str | None, dict[str, object] | None]:
    """A streamed chat completion with usage: (content chunks, finish_reason, usage)."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    req = urllib.request.Request(
        url + "/v1/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    chunks, finish, usage, done = 0, None, None, False
    with urllib.request.urlopen(req, timeout=120) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                event = json.loads(line[6:])
                assert "error" not in event, event
                for choice in event.get("choices") or ():
                    chunks += bool(choice["delta"].get("content"))
                    finish = choice.get("finish_reason") or finish
                usage = event.get("usage") or usage
    assert done, "stream cut before [DONE]"
    return chunks, finish, usage


def test_vllm_profile_serves_through_the_entry_point(cluster: Cluster) -> None:
    with contextlib.ExitStack() as stack:
        started = time.monotonic()
        extra = _build_args(cluster, stack)
        cluster.run(
            ["bash", "deploy/docker/build.sh", IMAGE, "--build-arg", "SMG_IMAGE=smg-node:local", *extra],
            BUILD_TIMEOUT_S,
            env={"DOCKERFILE": "deploy/compose/vllm/Dockerfile"},
        )
    built = time.monotonic() - started
    size_gb = int(cluster.run(["docker", "image", "inspect", "-f", "{{.Size}}", IMAGE])) / 1e9
    _report(f"image built in {built:.0f} s, {size_gb:.2f} GB")

    profile = ("--profile", "vllm")
    cluster.extra_env["SMG_POLICY"] = "cache_aware"
    try:
        started = time.monotonic()
        cluster.compose(*profile, "up", "-d", timeout_s=COMPOSE_TIMEOUT_S)
        wait_until(cluster.meshed, timeout_s=240, what="the nodes back, with cache_aware", interval_s=1)
        wait_until(
            lambda: _registered(cluster.url),
            timeout_s=SERVE_TIMEOUT_S,
            what="vllm-register to register the engine",
            interval_s=2,
        )
        registered = time.monotonic() - started
        cluster.compose("stop", "worker-1", "worker-2")
        wait_until(lambda: _engine_only(cluster), timeout_s=120, what="the engine alone in rotation", interval_s=1)

        body = {"model": MODEL, "messages": [{"role": "user", "content": LONG_PROMPT}], "max_tokens": 8}
        first = _post(cluster.url + "/v1/chat/completions", body)
        answered = time.monotonic() - started
        (choice,) = first["choices"]  # type: ignore[misc]
        assert choice["finish_reason"] in ("length", "stop"), first
        assert isinstance(choice["message"]["content"], str)
        usage = first["usage"]
        assert isinstance(usage, dict)
        assert usage["prompt_tokens"] > 256 and 0 < usage["completion_tokens"] <= 8, usage
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"], usage

        chunks, finish, stream_usage = _stream(cluster.url, LONG_PROMPT, 8)
        assert finish in ("length", "stop") and 0 < chunks <= 8, (chunks, finish)
        assert stream_usage is not None and stream_usage["prompt_tokens"] == usage["prompt_tokens"], stream_usage
        # The repeat of the prompt hit the engine's prefix cache (whole 128-token blocks).
        details = stream_usage.get("prompt_tokens_details") or {}
        assert isinstance(details, dict) and details.get("cached_tokens", 0) >= 128, stream_usage
        _report(f"up to registered {registered:.0f} s, to first answer {answered:.0f} s; usage {stream_usage}")
    finally:
        cluster.compose(*profile, "rm", "-f", "-s", "-v", "vllm", "vllm-register")
