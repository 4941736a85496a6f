"""CPU per request of the whole HTTP path in one process: the node's aiohttp app in front of in-memory workers
(node.workers.memory), driven by an aiohttp client over loopback. No gRPC, no SMG: a cheap before/after
check of the request pipeline's own cost (client parsing included, the same on both sides).

    .venv/bin/python -m bench.request_bench [--requests 200] [--api chat,messages] [--outputs 20,200]

Chat completions (``--api messages``: Anthropic Messages, the same prompt and answer) with a 200-token prompt
and a 200-token answer (``--outputs``; Llama-3 tokenizer): streamed (one token per worker message, so one SSE
frame per token) and not streamed; median of 5 rounds, CPU time of the process.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
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
PROMPT_TOKENS = 200
ROUNDS = 5
PATHS = {"chat": "/v1/chat/completions", "messages": "/v1/messages"}


async def run(
    requests: int,
    *,
    deadlines_off: bool,
    apis: tuple[str, ...] = ("chat",),
    outputs: tuple[int, ...] = (ANSWER_TOKENS,),
) -> dict[str, float]:
    model_dir = launch.prepare_model(BENCH_DIR / "out" / "models")
    model = load_served_model(str(model_dir), served_name="llama3")
    text_ids = model.tokenizer.encode(TEXT * 2, add_special_tokens=False)
    # The user turn: PROMPT_TOKENS tokens of text (the template adds its own few around it).
    question = model.tokenizer.decode(text_ids[:PROMPT_TOKENS], skip_special_tokens=True)

    def reply(request: WorkerRequest) -> list[list[int]]:
        return [text_ids[: request.params.max_tokens]] * request.params.n

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
        results: dict[str, float] = {}
        try:
            async with aiohttp.ClientSession() as http:
                for api, answer_tokens, stream in itertools.product(apis, outputs, (True, False)):
                    url = f"http://127.0.0.1:{port}{PATHS[api]}"
                    body = {
                        "model": "llama3",
                        "messages": [{"role": "user", "content": question}],
                        "max_tokens": answer_tokens,
                        "stream": stream,
                    }

                    async def one(body: dict[str, object] = body, url: str = url) -> None:
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
                    kind = "stream" if stream else "json"
                    results[f"{api} {PROMPT_TOKENS}/{answer_tokens} {kind}"] = statistics.median(rounds)
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
    parser.add_argument("--api", default="chat", help="comma-separated: chat, messages (Anthropic)")
    parser.add_argument("--outputs", default=str(ANSWER_TOKENS), help="answer lengths in tokens, e.g. 20,200")
    args = parser.parse_args()
    apis = tuple(a.strip() for a in args.api.split(","))
    if unknown := set(apis) - set(PATHS):
        parser.error(f"unknown --api {', '.join(sorted(unknown))}; known: {', '.join(PATHS)}")
    outputs = tuple(int(o) for o in args.outputs.split(","))
    results = asyncio.run(run(args.requests, deadlines_off=args.deadlines_off, apis=apis, outputs=outputs))
    for kind, us in results.items():
        print(f"{kind}: {us:.0f} µs CPU per request (prompt/answer tokens, client included)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
