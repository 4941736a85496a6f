"""CPU per request of the whole HTTP path in one process: the node's aiohttp app in front of in-memory workers
(node.workers.memory), driven by an aiohttp client over loopback. No gRPC, no SMG: a cheap before/after
check of the request pipeline's own cost (client parsing included, the same on both sides).

    .venv/bin/python -m bench.request_bench [--requests 200]

Chat completions with a short prompt and a 200-token answer (Llama-3 tokenizer): streamed (one token per
worker message, so one SSE frame per token) and not streamed; median of 5 rounds, CPU time of the process.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import aiohttp
from aiohttp import web

from bench import launch
from node.http.server import build_app
from node.http.tenancy import ApiConfig
from node.metrics import NodeMetrics
from node.pipeline.cpu import CpuPool
from node.pipeline.served_model import load_served_model
from node.tasks import Supervisor
from node.workers.deadlines import DeadlineConfig
from node.workers.memory import MemoryWorker, memory_pool
from node.workers.types import WorkerRequest
from storage.memory import memory_stores

BENCH_DIR = Path(__file__).resolve().parent
TEXT = "The quick brown fox jumps over the lazy dog, and then it runs far away into the forest. " * 20
ANSWER_TOKENS = 200
ROUNDS = 5


async def run(requests: int, *, deadlines_off: bool) -> dict[str, float]:
    model_dir = launch.prepare_model(BENCH_DIR / "out" / "models")
    model = load_served_model(str(model_dir), served_name="llama3")
    answer = model.tokenizer.encode(TEXT, add_special_tokens=False)[:ANSWER_TOKENS]

    def reply(request: WorkerRequest) -> list[list[int]]:
        return [answer] * request.params.n

    cpu = CpuPool(threads=2)
    async with Supervisor() as sup:
        pool = memory_pool([MemoryWorker("grpc://memory:1", reply=reply)], supervisor=sup)
        app = build_app(
            models=[model],
            pool=pool,
            cpu=cpu,
            metrics=NodeMetrics(pool),
            max_body_bytes=1 << 20,
            stores=memory_stores(max_items=1000, retention_s=60.0),
            tenancy=ApiConfig(),
            **({"deadlines": DeadlineConfig(0.0, 0.0, 0.0)} if deadlines_off else {}),
        )
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        results: dict[str, float] = {}
        try:
            async with aiohttp.ClientSession() as http:
                for stream in (True, False):
                    body = {
                        "model": "llama3",
                        "messages": [{"role": "user", "content": "Tell me about the fox."}],
                        "max_tokens": ANSWER_TOKENS,
                        "stream": stream,
                    }

                    async def one(body: dict[str, object] = body) -> None:
                        async with http.post(url, json=body) as resp:
                            assert resp.status == 200, await resp.text()
                            await resp.read()

                    for _ in range(20):
                        await one()
                    rounds = []
                    for _ in range(ROUNDS):
                        start = time.process_time()
                        for _ in range(requests):
                            await one()
                        rounds.append(1e6 * (time.process_time() - start) / requests)
                    results["stream" if stream else "json"] = statistics.median(rounds)
        finally:
            await runner.cleanup()
            cpu.close()
    return results


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument(
        "--deadlines-off", action="store_true", help="no per-stream deadlines (their per-message timer costs CPU)"
    )
    args = parser.parse_args()
    results = asyncio.run(run(args.requests, deadlines_off=args.deadlines_off))
    for kind, us in results.items():
        print(f"{kind}: {us:.0f} µs CPU per chat request ({ANSWER_TOKENS}-token answer, client included)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
