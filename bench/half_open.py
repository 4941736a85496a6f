"""How long a Generate stream takes to fail once its worker vanishes mid-stream without closing the connection.

    .venv/bin/python -m bench.half_open [--cap-s 60]

Per transport (h2, grpc): a `smg-node sim-worker` in its own process streams a long answer; after the first
message the worker is SIGSTOPped (its sockets stay open, nothing answers: a half-open connection, as a
powered-off host or a dropped flow looks). Reported is the time from the stop until the stream fails, with
the default keepalive settings (WorkerPoolConfig), or "still hanging" after ``--cap-s``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import time

from node.config import WorkerPoolConfig
from node.models.prepare import default_models_dir, prepare_model
from node.workers.channel_config import ChannelConfig
from node.workers.types import SamplingParams, WorkerRequest
from node.workers.vllm_grpc import VllmGrpcClient


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_listening(port: int) -> None:
    for _ in range(600):
        try:
            socket.create_connection(("127.0.0.1", port), 0.1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit("the simulated worker did not start")


async def _measure(transport: str, pid: int, port: int, cap_s: float) -> str:
    channel = ChannelConfig.from_pool(WorkerPoolConfig())
    client = VllmGrpcClient(f"grpc://127.0.0.1:{port}", generate_transport=transport, channel=channel)  # type: ignore[arg-type]
    params = SamplingParams(max_tokens=1_000_000, ignore_eos=True)
    stream = client.generate(WorkerRequest("half-open", list(range(1000, 1020)), params))
    await anext(stream)
    os.kill(pid, signal.SIGSTOP)
    started = time.monotonic()
    try:
        async with asyncio.timeout(cap_s):
            async for _ in stream:
                pass
        outcome = "ended normally"
    except TimeoutError:
        outcome = f"still hanging after {cap_s:g} s"
    except Exception as exc:  # what the gateway would see
        outcome = f"failed: {str(exc)[:100]}"
    took = time.monotonic() - started
    os.kill(pid, signal.SIGCONT)
    await stream.aclose()
    await client.close()
    return f"{transport:5} {took:6.2f} s  {outcome}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cap-s", type=float, default=60.0, help="give up waiting after this long")
    args = parser.parse_args()
    model_dir = str(prepare_model("llama3", default_models_dir(os.environ)))
    for transport in ("h2", "grpc"):
        port = _free_port()
        argv = [sys.executable, "-m", "node.sim", "--model-path", model_dir, "--port", str(port), "--tpot-ms", "5"]
        sim = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            _wait_listening(port)
            print(asyncio.run(_measure(transport, sim.pid, port, args.cap_s)), flush=True)
        finally:
            os.kill(sim.pid, signal.SIGCONT)
            sim.kill()
            sim.wait()


if __name__ == "__main__":
    main()
