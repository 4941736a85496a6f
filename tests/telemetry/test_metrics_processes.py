"""`serve --processes 2` as a user runs it: one /metrics covers both processes, whichever answers the scrape.

Before, each process answered /metrics alone, so repeated scrapes of one node gave a counter as 1, 2, 1, 3, 2.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
import urllib.request
from pathlib import Path

import openai

from node.metrics import FLUSH_DELAY_S
from tests.procs import SMG_NODE, free_port, http_status, port_open, process, wait_until

SCRAPES = 12


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return str(resp.read().decode())


def _sample(text: str, name: str, labels: str = "") -> float:
    """The sum of every sample of ``name`` whose label set contains ``labels`` (e.g. 'route="/health"')."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")) and labels in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def _health_pids(url: str, count: int) -> list[int]:
    return [int(json.loads(_get(url + "/health"))["pid"]) for _ in range(count)]


def _live_pids(url: str) -> set[int]:
    try:
        return set(_health_pids(url, 10))
    except OSError:  # a connection the killed process had accepted
        return set()


def test_one_scrape_counts_every_process(llama3_model_dir: Path, tmp_path: Path) -> None:
    sim_port, http_port = free_port(), free_port()
    sim_args = [*SMG_NODE, "sim-worker", "--port", str(sim_port), "--model-path", str(llama3_model_dir)]
    sim_args += ["--tpot-ms", "2", "--ttft-base-ms", "1"]
    node_args = [*SMG_NODE, "serve", "--port", str(http_port), "--model-path", str(llama3_model_dir)]
    node_args += ["--worker", f"grpc://127.0.0.1:{sim_port}", "--processes", "2", "--health-interval-s", "0.3"]
    node_args += ["--history-backend", "redis", "--redis-url", "redis://127.0.0.1:6379/0"]
    url = f"http://127.0.0.1:{http_port}"
    with process(sim_args, log=tmp_path / "sim.log"), process(node_args, log=tmp_path / "node.log") as node:
        wait_until(lambda: port_open(sim_port), timeout_s=30, what="the sim worker to listen")
        wait_until(lambda: http_status(url + "/readiness") == 200, timeout_s=60, what="node readiness")
        wait_until(lambda: len(set(_health_pids(url, 10))) == 2, timeout_s=60, what="both processes serving")
        time.sleep(4 * FLUSH_DELAY_S)  # the /health calls above are in the shared files
        before = _sample(_get(url + "/metrics"), "smg_node_http_requests_total", 'route="/health"')
        # /health over new connections: the kernel spreads them over both processes.
        health_calls = _health_pids(url, 20)
        pids = set(health_calls)
        assert len(pids) == 2, "both processes answered /health"
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=30)
        completions = 6
        for _ in range(completions):
            client.completions.create(model="llama3", prompt="Once upon", max_tokens=4)

        # A process writes a finished request's counts to the shared files within FLUSH_DELAY_S (batched).
        time.sleep(4 * FLUSH_DELAY_S)
        values = []
        for _ in range(SCRAPES):
            text = _get(url + "/metrics")
            values.append(
                (
                    _sample(text, "smg_node_http_requests_total", 'route="/health"'),
                    _sample(text, "smg_node_http_requests_total", 'route="/v1/completions",status="200"'),
                    _sample(text, "smg_node_time_to_first_token_seconds_count", 'route="/v1/completions"'),
                    _sample(text, "smg_node_request_tokens_sum", 'kind="generation"'),
                )
            )
        assert len(set(values)) == 1, f"every scrape must agree, got {values}"
        health, done, ttft_count, generated = values[0]
        assert health == before + len(health_calls)
        assert done == completions
        assert ttft_count == completions
        assert generated == 4 * completions
        # Each process's own view is served too, labelled by process: both processes' worker verdicts.
        text = _get(url + "/metrics")
        healthy = re.findall(r'smg_node_worker_healthy\{process="(\d)",worker="[^"]+"\} 1\.0', text)
        assert sorted(healthy) == ["0", "1"], text[:2000]
        assert text.count("# TYPE smg_node_worker_healthy gauge") == 1

        # A process killed -9: the supervisor replaces it; its counts stay in the totals (never backwards).
        os.kill(max(pids), signal.SIGKILL)
        wait_until(lambda: len(_live_pids(url) - {max(pids)}) == 2, timeout_s=60, what="a replacement")
        after = _get(url + "/metrics")
        assert _sample(after, "smg_node_http_requests_total", 'route="/v1/completions",status="200"') == completions
        assert _sample(after, "smg_node_http_in_flight_requests") == 1  # the scrape itself, once

        # The supervisor removes the shared directory when it stops.
        shared = Path(_environ(min(pids))["PROMETHEUS_MULTIPROC_DIR"])
        assert shared.is_dir() and any(shared.glob("*.db"))
        node.send_signal(signal.SIGTERM)
        node.wait(timeout=60)
        assert not shared.exists()


def _environ(pid: int) -> dict[str, str]:
    entries = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(e.decode().split("=", 1) for e in entries if b"=" in e)
