"""A Responses stream that breaks after its 200 went out ends with response.failed, and nothing is stored:
the worker killed -9 mid-answer, or the history store failing in a way that is not an outage."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI

from node.app import run_node
from node.http.history import FAILED_MESSAGE
from storage.config import StorageConfig
from tests.http.conftest import node_config, start_cluster
from tests.procs import SMG_NODE, free_port, port_open, process, wait_until
from tests.storage.conftest import PG_PORT, PG_URL, drop_tables

DELTAS_BEFORE_FAILURE = 5


@contextlib.asynccontextmanager
async def node_before_worker_process(model_dir: Path, log_dir: Path) -> AsyncIterator[tuple[AsyncOpenAI, int]]:
    """A node in this loop (memory history) in front of one `smg-node sim-worker` process that a test may
    SIGKILL. Yields the client and the worker's pid."""
    port = free_port()
    args = [*SMG_NODE, "sim-worker", "--port", str(port), "--model-path", str(model_dir)]
    with process([*args, "--tpot-ms", "5", "--ttft-base-ms", "1"], log=log_dir / "sim.log") as sim:
        wait_until(lambda: port_open(port), timeout_s=30, what="the sim worker to listen")
        async with run_node(node_config(model_dir, [port])) as node:
            client = AsyncOpenAI(base_url=f"{node.url}/v1", api_key="unused", max_retries=0, timeout=30)
            try:
                yield client, sim.pid
            finally:
                await client.close()


async def test_worker_killed_mid_stream_ends_failed_and_stores_nothing(llama3_model_dir: Path, tmp_path: Path) -> None:
    async with node_before_worker_process(llama3_model_dir, tmp_path) as (client, sim_pid):
        stream = await client.responses.create(
            model="llama3",
            input="Tell me a long story",
            max_output_tokens=2000,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        events: list[Any] = []
        deltas = 0
        async for event in stream:
            events.append(event)
            if event.type == "response.output_text.delta":
                deltas += 1
                if deltas == DELTAS_BEFORE_FAILURE:
                    os.kill(sim_pid, signal.SIGKILL)
        assert deltas >= DELTAS_BEFORE_FAILURE
        assert events[0].type == "response.created"
        last = events[-1]
        assert last.type == "response.failed", [e.type for e in events[-3:]]
        assert [e.sequence_number for e in events] == list(range(len(events)))
        failed = last.response
        assert failed.id == events[0].response.id and failed.status == "failed"
        assert failed.error is not None and "worker" in failed.error.message.lower()
        with pytest.raises(openai.NotFoundError):
            await client.responses.retrieve(failed.id)
        with pytest.raises(openai.NotFoundError):
            await client.responses.input_items.list(failed.id)


async def test_store_error_that_is_no_outage_fails_cleanly(
    llama3_model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The node's tables vanish under it (the database answers, with an error no backend class covers):
    a stream still ends with response.failed, a JSON answer is a 500 in the API's envelope, the cause is
    logged, and the outage gate is not tripped (the next request reaches the store again)."""
    if not port_open(PG_PORT):
        pytest.skip("postgres is not running on 127.0.0.1")
    prefix = f"t{uuid.uuid4().hex[:10]}_"
    storage = StorageConfig(backend="postgres", postgres_url=PG_URL, table_prefix=prefix)
    try:
        async with start_cluster(llama3_model_dir, workers=1, storage=storage) as c:
            first = await c.client.responses.create(model=c.model, input="kept", max_output_tokens=4)
            await drop_tables(PG_URL, prefix)
            with caplog.at_level(logging.ERROR, logger="node.http.history"):
                events = [
                    e
                    async for e in await c.client.responses.create(
                        model=c.model, input="hi", max_output_tokens=4, stream=True
                    )
                ]
            assert [e.type for e in events[-2:]] == ["response.output_item.done", "response.failed"]
            failed: Any = events[-1].response  # type: ignore[union-attr]
            assert failed.status == "failed" and failed.error.message == FAILED_MESSAGE
            assert any("history store error" in r.getMessage() and r.exc_info for r in caplog.records)
            for _ in range(2):  # the second would be a fast 503 had the first tripped the outage gate
                status, body = await _post(c.node.url, {"model": c.model, "input": "hi", "max_output_tokens": 4})
                assert status == 500 and body["error"]["code"] == "storage_error", body
                assert body["error"]["message"] == FAILED_MESSAGE and body["error"]["type"] == "server_error"
            with pytest.raises(openai.InternalServerError):
                await c.client.responses.retrieve(first.id)
            r = await c.client.responses.create(model=c.model, input="hi", max_output_tokens=4, store=False)
            assert r.output_text
    finally:
        await drop_tables(PG_URL, prefix)


async def _post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as session, session.post(url + "/v1/responses", json=body) as resp:
        return resp.status, await resp.json()
