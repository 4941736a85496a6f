"""A real node process in front of a simulated worker process: what the fuzz tier and attacks talk to."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.procs import SMG_NODE, free_port, http_status, port_open, process, wait_until


@dataclass(frozen=True)
class NodeProcess:
    host: str
    port: int
    pid: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


@pytest.fixture(scope="module")
def node_process(llama3_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    logs = tmp_path_factory.mktemp("fuzz-node")
    sim_port, http_port = free_port(), free_port()
    sim_args = [*SMG_NODE, "sim-worker", "--port", str(sim_port), "--model-path", str(llama3_model_dir)]
    sim_args += ["--tpot-ms", "0.2", "--ttft-base-ms", "1"]
    node_args = [*SMG_NODE, "serve", "--processes", "1", "--port", str(http_port)]
    node_args += ["--model-path", str(llama3_model_dir), "--worker", f"grpc://127.0.0.1:{sim_port}"]
    node_args += ["--health-interval-s", "0.3"]
    with process(sim_args, log=logs / "sim.log"):
        wait_until(lambda: port_open(sim_port), timeout_s=30, what="the sim worker to listen")
        with process(node_args, log=logs / "node.log") as node:
            url = f"http://127.0.0.1:{http_port}"
            wait_until(lambda: http_status(url + "/readiness") == 200, timeout_s=30, what="node readiness")
            yield NodeProcess(host="127.0.0.1", port=http_port, pid=node.pid, log=logs / "node.log")
