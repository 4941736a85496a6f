"""The access log and the per-request histograms of a single-process node, and the pure pieces behind them."""

from __future__ import annotations

import logging
from pathlib import Path

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st

from node.app import run_node
from node.metrics import MAX_WORKER_LABELS, OTHER_WORKER, _BoundedLabel
from node.sim.worker import SimWorker
from node.telemetry.access_log import MAX_PATH_CHARS, access_line
from node.telemetry.record import RequestRecord
from node.telemetry.tally import RequestTally
from tests.http.conftest import fast_sim, node_config


async def test_one_access_line_and_histograms_per_request(
    llama3_model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="node.access")
    async with (
        SimWorker(fast_sim(llama3_model_dir)) as sim,
        run_node(node_config(llama3_model_dir, [sim.port])) as node,
        aiohttp.ClientSession() as s,
    ):
        body = {"model": "llama3", "prompt": "Once upon a time", "max_tokens": 5, "stream": True}
        async with s.post(node.url + "/v1/completions", json=body, headers={"X-Request-Id": "rid-42"}) as r:
            assert r.status == 200
            await r.read()
        async with s.post(node.url + "/v1/completions", json={"model": "nope", "prompt": "x"}) as r:
            assert r.status == 404
            minted = r.headers["X-Request-Id"]
            assert (await r.json())["error"]["request_id"] == minted, "the error body names the request id"
        async with s.get(node.url + "/metrics") as r:
            metrics = await r.text()
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "node.access"]
    streamed = next(line for line in lines if "request_id=rid-42" in line)
    fields = dict(part.split("=", 1) for part in streamed.split(" "))
    assert fields["method"] == "POST" and fields["route"] == "/v1/completions" and fields["status"] == "200"
    assert fields["model"] == "llama3" and fields["worker"] == f"grpc://127.0.0.1:{sim.port}"
    assert fields["completion_tokens"] == "5" and int(fields["prompt_tokens"]) > 0
    assert 0 < float(fields["ttft_ms"]) <= float(fields["duration_ms"])
    missing = next(line for line in lines if "status=404" in line)
    assert f"request_id={minted}" in missing
    assert "worker=-" in missing and "ttft_ms=-" in missing
    worker = f'worker="grpc://127.0.0.1:{sim.port}"'
    assert (
        f'smg_node_time_to_first_token_seconds_count{{model="llama3",route="/v1/completions",{worker}}} 1.0' in metrics
    )
    assert f'smg_node_time_per_output_token_seconds_count{{model="llama3",{worker}}} 1.0' in metrics
    assert 'smg_node_request_tokens_sum{kind="generation",model="llama3",route="/v1/completions"} 5.0' in metrics
    assert 'smg_node_http_request_duration_seconds_count{model="",route="/v1/completions",status="404"} 1.0' in metrics
    assert f'smg_node_worker_requests_total{{status="200",{worker}}} 1.0' in metrics
    assert 'worker=""' not in metrics, "a request no worker served makes no per-worker series"


def test_access_line_bounds_the_path() -> None:
    rec = RequestRecord(method="GET", route="unmatched")
    line = access_line(rec, path="/" + "a" * 10_000, status=404, duration_s=0.001)
    assert len(line) < MAX_PATH_CHARS + 300 and "status=404" in line


def test_ttft_and_tpot_from_token_arrivals() -> None:
    rec = RequestRecord(started=10.0)
    rec.first_token, rec.last_token, rec.completion_tokens = 10.5, 11.5, 11
    assert rec.ttft_s == 0.5 and rec.tpot_s == pytest.approx(0.1)
    rec.completion_tokens = 1
    assert rec.tpot_s is None, "one token has no time per output token"


@given(st.lists(st.text(min_size=1, max_size=4), max_size=400))
def test_worker_labels_stay_bounded(values: list[str]) -> None:
    label = _BoundedLabel(MAX_WORKER_LABELS, OTHER_WORKER)
    seen = {label(v) for v in values}
    assert len(seen - {OTHER_WORKER}) <= MAX_WORKER_LABELS
    first = list(dict.fromkeys(values))[:MAX_WORKER_LABELS]
    assert all(label(v) == v for v in first), "the first workers keep their own label"


def test_tally_by_class_and_cache_ratio() -> None:
    tally = RequestTally()
    tally.observe(200, "w1", prompt=100, cached=25)
    tally.observe(503, "", prompt=0, cached=0)
    tally.observe(404, "", prompt=0, cached=0)
    assert tally.total == 3 and tally.by_class == {"2xx": 1, "3xx": 0, "4xx": 1, "5xx": 1}
    assert tally.workers["w1"].cache_hit_ratio == 0.25
