"""Durable before acknowledged: a stored response survives kill -9 of the node that answered it."""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

import openai
import pytest

from tests.procs import SMG_NODE, free_port, http_status, port_open, process, wait_until

BACKENDS = {
    "redis": ["--history-backend", "redis", "--redis-url", "redis://127.0.0.1:6379/0"],
    "postgres": ["--history-backend", "postgres", "--postgres-url", "postgresql://postgres@127.0.0.1:5432/test"],
}


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_response_survives_kill_9_of_its_node(backend: str, llama3_model_dir: Path, tmp_path: Path) -> None:
    prefix = "dur" + uuid.uuid4().hex[:8]
    flags = [*BACKENDS[backend], "--history-key-prefix", prefix, "--history-table-prefix", prefix + "_"]
    sim_port = free_port()
    sim_args = [*SMG_NODE, "sim-worker", "--port", str(sim_port), "--model-path", str(llama3_model_dir)]

    def node_args(port: int) -> list[str]:
        return [*SMG_NODE, "serve", "--port", str(port), "--model-path", str(llama3_model_dir),
                "--worker", f"grpc://127.0.0.1:{sim_port}", "--processes", "1", *flags]  # fmt: skip

    first, second = free_port(), free_port()
    with process(sim_args, log=tmp_path / "sim.log"):
        wait_until(lambda: port_open(sim_port), timeout_s=30, what="sim worker")
        with process(node_args(first), log=tmp_path / "a.log") as a:
            url = f"http://127.0.0.1:{first}"
            wait_until(lambda: http_status(url + "/readiness") == 200, timeout_s=60, what="node a")
            client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=30)
            stream = client.responses.create(model="llama3", input="Remember me", max_output_tokens=300, stream=True)
            response_id = ""
            for event in stream:
                if event.type == "response.completed":
                    response_id = event.response.id
                    os.kill(a.pid, signal.SIGKILL)  # right after the final event: nothing more may be written
                    break
            assert response_id
        with process(node_args(second), log=tmp_path / "b.log"):
            url = f"http://127.0.0.1:{second}"
            wait_until(lambda: http_status(url + "/readiness") == 200, timeout_s=60, what="node b")
            client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=30)
            stored = client.responses.retrieve(response_id)
            assert stored.id == response_id and stored.status == "completed"
            assert stored.output_text
            items = client.responses.input_items.list(response_id)
            assert any("Remember me" in str(item) for item in items.data)
