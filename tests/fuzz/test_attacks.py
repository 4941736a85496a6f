"""The measured attacks, against a real node process: each used to exhaust memory or stall the event loop.

- a 1 MB stop string, and many long stop strings with n=128: the stop matcher built every prefix of every
  stop per choice (quadratic memory: OOM at 22 GB);
- six 1 GiB gzip bombs (1 MB each) in parallel: aiohttp inflated them on the event loop, and went on
  inflating while draining the refused bodies; /health stalled for seconds and workers were marked unhealthy.

Bound asserted: the node's peak RSS (VmHWM) grows by less than ATTACK_RSS_GROWTH_MB over all of them: each
bomb may inflate up to the 16 MB body limit before it is refused (~20 MB with the compressed body and buffer
slack), six at once; the stop strings add nothing measurable.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from tests.fuzz.conftest import NodeProcess
from tests.fuzz.payloads import gzip_bomb, vm_hwm_mb

ATTACK_RSS_GROWTH_MB = 200


def _post(node: NodeProcess, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, object]]:
    conn = http.client.HTTPConnection(node.host, node.port, timeout=60)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json", **headers})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def _chat(node: NodeProcess, **fields: object) -> tuple[int, dict[str, object]]:
    body = {"model": "llama3", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **fields}
    return _post(node, "/v1/chat/completions", json.dumps(body).encode(), {})


def _error(body: dict[str, object]) -> dict[str, object]:
    err = body["error"]
    assert isinstance(err, dict)
    return err


class _HealthWatch:
    """Polls /health from a thread; records the slowest answer."""

    def __init__(self, node: NodeProcess) -> None:
        self._node = node
        self._stop = threading.Event()
        self.slowest_s = 0.0
        self.failures = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            start = time.monotonic()
            try:
                conn = http.client.HTTPConnection(self._node.host, self._node.port, timeout=10)
                conn.request("GET", "/health")
                ok = conn.getresponse().status == 200
                conn.close()
            except OSError:
                ok = False
            self.failures += not ok
            self.slowest_s = max(self.slowest_s, time.monotonic() - start)
            self._stop.wait(0.05)

    def __enter__(self) -> _HealthWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=15)


def test_stop_strings_and_gzip_bombs_keep_the_node_small_and_responsive(node_process: NodeProcess) -> None:
    node = node_process
    assert _chat(node)[0] == 200  # warm: tokenizer caches, worker channel
    base_mb = vm_hwm_mb(node.pid)
    bomb = gzip_bomb(1024)
    assert len(bomb) < 1_100_000
    with _HealthWatch(node) as health:
        status, body = _chat(node, stop="x" * 1_000_000)
        assert status == 400 and _error(body)["param"] == "stop" and _error(body)["code"] == "max_stop_chars"

        # At the limits: 8 stops of 1024 four-byte characters (8192 in all) for each of 128 choices. The old
        # matcher held 8 x 1024^2 / 2 characters of prefixes per choice: ~2 GB here.
        stops = [chr(0x1F600 + i) * 1024 for i in range(8)]
        status, body = _chat(node, stop=stops, n=128)
        assert status == 200, body
        assert len(body["choices"]) == 128  # type: ignore[arg-type]

        with ThreadPoolExecutor(6) as pool:
            answers = list(
                pool.map(lambda _: _post(node, "/v1/chat/completions", bomb, {"Content-Encoding": "gzip"}), range(6))
            )
        for status, body in answers:
            assert status == 413 and _error(body)["code"] == "request_too_large"
    assert health.failures == 0
    assert health.slowest_s < 1.0, f"/health took {health.slowest_s:.2f} s during the attacks"
    growth = vm_hwm_mb(node.pid) - base_mb
    assert growth < ATTACK_RSS_GROWTH_MB, f"peak RSS grew by {growth:.0f} MB"
    assert _chat(node)[0] == 200
