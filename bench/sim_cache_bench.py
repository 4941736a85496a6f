"""The simulated engine under long concurrent prompts: CPU per request, of its prefix cache and in whole.

16 requests of 7,800 distinct tokens each run at once against the default capacity (8,192 blocks of 16):
the leases pin ~7,800 blocks, so every block a new request stores first evicts an unpinned one.
"cache": what the prefix cache does for one request (admit: match, pin, store; extend with its output;
release). "engine": a SimEngine with zero latency serving such requests, 16 in flight (each of 16 lanes
starts its next request as its last ends; 32 output tokens each), process CPU per request.

    .venv/bin/python -m bench.sim_cache_bench [--requests 200]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections import deque

from node.sim.config import SimWorkerConfig
from node.sim.prefix_cache import Lease, PrefixCache

CONCURRENT = 16
PROMPT_TOKENS = 7_800
OUTPUT_TOKENS = 64


def run(requests: int, seed: int = 0) -> float:
    """Milliseconds of CPU per request in steady state (after the cache has filled)."""
    defaults = SimWorkerConfig(model_path="unused")
    cache = PrefixCache(defaults.block_size, defaults.cache_capacity_blocks)
    rng = random.Random(seed)
    running: deque[tuple[Lease, list[int]]] = deque()

    def one() -> float:
        """The CPU seconds the cache spends on one request (making its prompt is not counted)."""
        prompt = [rng.randrange(128_000) for _ in range(PROMPT_TOKENS)]
        start = time.process_time()
        admission = cache.admit(prompt)
        running.append((admission.lease, prompt))
        if len(running) > CONCURRENT:
            lease, old = running.popleft()
            cache.extend(lease, old + [1] * OUTPUT_TOKENS)
            cache.release(lease)
        return time.process_time() - start

    for _ in range(3 * CONCURRENT):  # fill the cache and reach the steady state
        one()
    return sum(one() for _ in range(requests)) / requests * 1000


def run_engine(requests: int, seed: int = 0) -> float:
    """Milliseconds of process CPU per request through SimEngine, 16 at a time, after a warm-up."""
    import tempfile
    from pathlib import Path

    from node.models.prepare import prepare_model
    from node.sim.engine import GenerateSpec, SimEngine
    from node.sim.token_generator import SamplingSpec
    from node.sim.worker import load_sim_model

    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as tmp:
        config = SimWorkerConfig(
            model_path=str(prepare_model("llama3", Path(tmp))),
            ttft_base_ms=0,
            ttft_per_uncached_token_ms=0,
            tpot_ms=0,
            tpot_per_running_ms=0,
            max_running_requests=CONCURRENT,
        )
        model = load_sim_model(config)

    async def serve() -> float:
        engine = SimEngine(config, model.folder, model.vocabulary)

        async def one(i: int, prompt: tuple[int, ...]) -> None:
            spec = GenerateSpec(f"r{i}", prompt, SamplingSpec(max_tokens=32, ignore_eos=True))
            async for _ in engine.submit(spec):
                pass

        async def stream(count: int) -> float:
            """``count`` requests through 16 lanes, each starting its next as its last ends (staggered, so
            every admission meets 15 others' pinned prompts); process CPU seconds."""
            prompts = [tuple(rng.randrange(100_000) for _ in range(PROMPT_TOKENS)) for _ in range(count)]
            lanes = [prompts[k::CONCURRENT] for k in range(CONCURRENT)]

            async def lane(k: int) -> None:
                for i, prompt in enumerate(lanes[k]):
                    await one(i * CONCURRENT + k, prompt)

            start = time.process_time()
            await asyncio.gather(*(lane(k) for k in range(CONCURRENT)))
            return time.process_time() - start

        await stream(3 * CONCURRENT)  # fill the cache
        spent = await stream(requests)
        engine.close()
        return spent / requests * 1000

    return asyncio.run(serve())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    what = f"{CONCURRENT} concurrent {PROMPT_TOKENS}-token prompts"
    print(f"cache:  {run(args.requests):.2f} ms CPU per request ({what})")
    print(f"engine: {run_engine(args.requests):.2f} ms CPU per request ({what}, 32 output tokens)")


if __name__ == "__main__":
    main()
