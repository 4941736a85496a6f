"""Write throughput and latency of the history stores.

Per backend: `--requests` ResponseStore.put() calls from `--concurrency` concurrent writers, each a
response with 4 input items and 2 output items (~1.5 KB of JSON, a typical chat turn with a tool
call). Every put extends one of `--concurrency` previous_response_id chains, so the parent-exists check
is exercised. Prints stored responses per second and p50/p99 put() latency.

    .venv/bin/python bench/storage_bench.py [--backends memory,redis,postgres] [--requests 4000]

Redis and Postgres run against the given URLs under a throwaway key/table prefix that is removed
afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid

import asyncpg
import redis.asyncio as aioredis

from storage import Item, ResponseRecord, StorageConfig, open_stores

TEXT = "The quick brown fox jumps over the lazy dog. " * 4


def turn(n: int, worker: int) -> tuple[list[Item], list[Item]]:
    """One chat turn: 4 input messages; a function call and an assistant message as output."""

    def message(kind: str, i: int, role: str) -> Item:
        content = [{"type": "input_text", "text": TEXT}]
        return Item.from_json(
            {"id": f"msg_{kind}{worker}_{n}_{i}", "type": "message", "role": role, "content": content}
        )

    call = {
        "id": f"fc_{worker}_{n}",
        "type": "function_call",
        "call_id": f"call_{worker}_{n}",
        "name": "lookup",
    }
    inputs = [message("in", i, "user") for i in range(4)]
    output = [Item.from_json(call | {"arguments": '{"q": "fox"}'}), message("out", 0, "assistant")]
    return inputs, output


async def run_backend(config: StorageConfig, requests: int, concurrency: int) -> tuple[float, list[float]]:
    latencies_s: list[float] = []
    tenant = "bench"
    async with open_stores(config) as stores:
        # Warm up connections and (for postgres) migrations outside the measurement.
        await stores.responses.put(tenant, ResponseRecord("resp_warm", 0, {}), [])
        per_worker = requests // concurrency

        async def writer(w: int) -> None:
            prev: str | None = None
            for n in range(per_worker):
                rid = f"resp_{w}_{n}"
                inputs, output = turn(n, w)
                usage = {"input_tokens": 120, "output_tokens": 40, "total_tokens": 160}
                body = {
                    "id": rid,
                    "object": "response",
                    "status": "completed",
                    "model": "bench",
                    "usage": usage,
                }
                record = ResponseRecord(rid, 1_700_000_000, body, tuple(output), prev)
                start = time.perf_counter()
                await stores.responses.put(tenant, record, inputs)
                latencies_s.append(time.perf_counter() - start)
                prev = rid

        start = time.perf_counter()
        await asyncio.gather(*(writer(w) for w in range(concurrency)))
        elapsed_s = time.perf_counter() - start
    return len(latencies_s) / elapsed_s, latencies_s


async def cleanup(config: StorageConfig) -> None:
    if config.backend == "postgres":
        conn = await asyncpg.connect(config.postgres_url)
        try:
            tables = await conn.fetch(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() AND starts_with(tablename, $1)",
                config.table_prefix,
            )
            for row in tables:
                await conn.execute(f'DROP TABLE IF EXISTS "{row[0]}" CASCADE')
        finally:
            await conn.close()
    elif config.backend == "redis":
        client = aioredis.Redis.from_url(config.redis_url)
        try:
            keys = [k async for k in client.scan_iter(match=f"{config.key_prefix}:*", count=1000)]
            for i in range(0, len(keys), 1000):
                await client.delete(*keys[i : i + 1000])
        finally:
            await client.aclose()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default="memory,redis,postgres")
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--postgres-url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args()

    tag = uuid.uuid4().hex[:8]
    rows = []
    for backend in args.backends.split(","):
        config = StorageConfig(
            backend=backend,
            postgres_url=args.postgres_url,
            redis_url=args.redis_url,
            table_prefix=f"bench{tag}_",
            key_prefix=f"bench{tag}",
            memory_max_items=10 * args.requests,
            postgres_pool_max_size=args.concurrency,
            redis_max_connections=args.concurrency,
        )
        try:
            rate, latencies_s = await run_backend(config, args.requests, args.concurrency)
        finally:
            await cleanup(config)
        cuts = statistics.quantiles(latencies_s, n=100)
        rows.append((backend, len(latencies_s), rate, cuts[49] * 1000, cuts[98] * 1000))

    print(f"ResponseStore.put, concurrency {args.concurrency}, 4 input + 2 output items per response")
    print(f"{'backend':<10} {'puts':>6} {'puts/s':>9} {'p50 ms':>8} {'p99 ms':>8}")
    for backend, count, rate, p50, p99 in rows:
        print(f"{backend:<10} {count:>6} {rate:>9.0f} {p50:>8.2f} {p99:>8.2f}")


if __name__ == "__main__":
    asyncio.run(main())
