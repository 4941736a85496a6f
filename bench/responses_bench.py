"""Stored responses through the HTTP API: POST /v1/responses with store=true vs store=false, per history backend.

    .venv/bin/python -m bench.responses_bench [--backends memory,redis,postgres] [--duration-s 6] [--rounds 3]

One zero-latency simulated worker (`smg-node sim-worker`) serves one `smg-node serve --processes 1` per backend
(started afresh for each, on a throwaway Redis key prefix / Postgres table prefix removed afterwards).
Per point: a closed loop of `--concurrency` users sending non-streaming Responses requests (a short text
input, exactly `--max-output-tokens` tokens via ignore_eos) for `--duration-s`. store=false and store=true
points alternate for `--rounds` rounds so drift on a shared machine does not favour one; the table shows
the medians over rounds. With store=true every 200 means the response was durably written first, so its
req/s is stored responses per second and its latency includes the write; "added" is the store=true latency
minus the store=false latency at the same percentile, and "added node CPU" the node process's extra CPU
time per request (less sensitive than latency to other load on a shared machine).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

import aiohttp
import asyncpg
import redis.asyncio as aioredis

from bench import launch
from bench.launch import LaunchError, Service
from bench.proc import sample_tree

PG_URL = "postgresql://postgres@127.0.0.1:5432/test"
REDIS_URL = "redis://127.0.0.1:6379/0"
READY_TIMEOUT_S = 60.0
REQUEST_TIMEOUT_S = 30.0
# A point gives up after this many failed requests: something is broken, more samples add nothing.
MAX_ERRORS = 20


@dataclass(frozen=True, slots=True)
class Point:
    requests: int
    wall_s: float
    latencies_s: tuple[float, ...]
    errors: int
    node_cpu_s: float = 0.0  # the node process's CPU over the point

    @property
    def cpu_ms_per_request(self) -> float:
        return 1000 * self.node_cpu_s / max(1, self.requests)

    @property
    def rps(self) -> float:
        return self.requests / self.wall_s

    def pct_ms(self, q: float) -> float:
        ordered = sorted(self.latencies_s)
        return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run_point(url: str, model: str, *, store: bool, concurrency: int, duration_s: float, tokens: int) -> Point:
    latencies: list[float] = []
    errors = 0
    deadline = time.perf_counter() + duration_s
    counter = iter(range(10**9))

    async def user(session: aiohttp.ClientSession) -> None:
        nonlocal errors
        while time.perf_counter() < deadline and errors < MAX_ERRORS:
            n = next(counter)
            body = {
                "model": model,
                "input": f"Request {n}: tell me about the weather in a short sentence.",
                "max_output_tokens": tokens,
                "ignore_eos": True,
                "store": store,
            }
            start = time.perf_counter()
            async with session.post(url, json=body) as resp:
                payload = await resp.read()
                if resp.status != 200:
                    errors += 1
                    print(f"  error {resp.status}: {payload[:200]!r}")
                    continue
            latencies.append(time.perf_counter() - start)

    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    start = time.perf_counter()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.gather(*(user(session) for _ in range(concurrency)))
    return Point(len(latencies), time.perf_counter() - start, tuple(latencies), errors)


async def wait_ready(service: Service, base_url: str) -> str:
    """Wait until a store=false response succeeds; return the served model name."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        while time.monotonic() < deadline:
            if not service.alive():
                raise LaunchError(f"{service.name} exited:\n{service.log_tail()}")
            try:
                async with session.get(base_url + "/v1/models") as resp:
                    model = str((await resp.json())["data"][0]["id"])
                body = {"model": model, "input": "ready?", "max_output_tokens": 2, "store": False}
                async with session.post(base_url + "/v1/responses", json=body) as resp:
                    if resp.status == 200:
                        return model
            except (aiohttp.ClientError, TimeoutError, KeyError, IndexError, ValueError):
                pass
            await asyncio.sleep(0.2)
    raise LaunchError(f"{service.name} not ready in {READY_TIMEOUT_S:.0f} s:\n{service.log_tail()}")


def backend_flags(backend: str, prefix: str) -> list[str]:
    flags = ["--history-backend", backend]
    if backend == "redis":
        flags += ["--redis-url", REDIS_URL, "--history-key-prefix", prefix]
    elif backend == "postgres":
        flags += ["--postgres-url", PG_URL, "--history-table-prefix", prefix + "_"]
    return flags


async def cleanup(backend: str, prefix: str) -> None:
    if backend == "redis":
        client = aioredis.Redis.from_url(REDIS_URL)
        try:
            keys = [k async for k in client.scan_iter(match=f"{prefix}:*", count=1000)]
            for start in range(0, len(keys), 1000):
                await client.delete(*keys[start : start + 1000])
        finally:
            await client.aclose()
    elif backend == "postgres":
        conn = await asyncpg.connect(PG_URL)
        try:
            rows = await conn.fetch("SELECT tablename FROM pg_tables WHERE starts_with(tablename, $1)", prefix + "_")
            for row in rows:
                await conn.execute(f'DROP TABLE IF EXISTS "{row[0]}" CASCADE')
        finally:
            await conn.close()


async def bench_backend(
    args: argparse.Namespace, backend: str, worker_url: str, model_dir: Path, out: Path
) -> dict[bool, list[Point]]:
    port = launch.free_port()
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    cmd = [*launch.node_command(port, worker_url, model_dir), "--processes", "1", *backend_flags(backend, prefix)]
    points: dict[bool, list[Point]] = {False: [], True: []}
    try:
        with launch.running(f"node-{backend}", cmd, out / f"node-{backend}.log") as node:
            base_url = f"http://127.0.0.1:{port}"
            model = await wait_ready(node, base_url)
            url = base_url + "/v1/responses"
            kw = {"concurrency": args.concurrency, "tokens": args.max_output_tokens}
            await run_point(url, model, store=True, duration_s=2.0, **kw)  # warm-up (connections, caches)
            for _ in range(args.rounds):
                for store in (False, True):
                    cpu0 = sample_tree(node.pid).cpu_s
                    p = await run_point(url, model, store=store, duration_s=args.duration_s, **kw)
                    p = replace(p, node_cpu_s=sample_tree(node.pid).cpu_s - cpu0)
                    points[store].append(p)
                    print(
                        f"  {backend:8} store={str(store).lower():5} {p.rps:7.1f} req/s  "
                        f"p50 {p.pct_ms(0.5):6.1f} ms  p99 {p.pct_ms(0.99):6.1f} ms  "
                        f"node CPU {p.cpu_ms_per_request:.2f} ms/req  errors {p.errors}"
                    )
    finally:
        await cleanup(backend, prefix)
    return points


def med(points: list[Point], f: str, q: float = 0.0) -> float:
    values = {"rps": lambda p: p.rps, "cpu": lambda p: p.cpu_ms_per_request, "p": lambda p: p.pct_ms(q)}[f]
    return statistics.median(values(p) for p in points)


async def main_async(args: argparse.Namespace) -> None:
    out = Path(tempfile.mkdtemp(prefix="responses_bench_"))
    model_dir = launch.prepare_model(out / "models")
    sim_port = launch.free_port()
    sim_cmd = launch.sim_worker_command(sim_port, model_dir)
    with launch.running("sim-worker", sim_cmd, out / "sim.log") as sim:
        launch.wait_port(sim, sim_port, READY_TIMEOUT_S)
        results = {
            b: await bench_backend(args, b, f"grpc://127.0.0.1:{sim_port}", model_dir, out)
            for b in args.backends.split(",")
        }
    print(
        f"\nconcurrency {args.concurrency}, {args.max_output_tokens} output tokens, {args.duration_s:g} s x "
        f"{args.rounds} rounds per point, medians; logs in {out}\n"
    )
    print(
        "| backend | stored resp/s | p50 ms | p99 ms | store=false resp/s | p50 ms | p99 ms | added p50 | added p99 "
        "| added node CPU/req |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for backend, pts in results.items():
        on, off = pts[True], pts[False]
        p50, p99 = med(on, "p", 0.5), med(on, "p", 0.99)
        q50, q99 = med(off, "p", 0.5), med(off, "p", 0.99)
        print(
            f"| {backend} | {med(on, 'rps'):.0f} | {p50:.1f} | {p99:.1f} | {med(off, 'rps'):.0f} | {q50:.1f} | "
            f"{q99:.1f} | {p50 - q50:+.1f} ms | {p99 - q99:+.1f} ms | {med(on, 'cpu') - med(off, 'cpu'):+.2f} ms |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default="memory,redis,postgres")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--duration-s", type=float, default=6.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-output-tokens", type=int, default=16)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
