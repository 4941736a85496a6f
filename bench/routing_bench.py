"""CPU cost of routing one long prompt against a large KV-event index, and the routing structures' memory.

Builds a ``KvIndex`` of ``--blocks`` blocks (16 tokens each) over ``--workers`` workers from Stored events:
each worker caches conversations of ``--prompt-tokens`` tokens that all begin with one shared 1,024-token
system prompt. Then measures the CPU time (``time.thread_time_ns``) of

- ``KvIndex.match`` for a prompt one worker holds entirely (the worst case: every block is hashed and
  looked up), one that leaves the shared prefix halfway through a conversation, and one no worker holds;
- ``CacheAware.select`` over all workers (loads, match, choice) for the full hit, and ``on_routed`` into the
  approximate tree for a worker that publishes no events;

and memory per indexed block and per tree page with tracemalloc on a smaller build, next to the index's own
estimate.

    .venv/bin/python bench/routing_bench.py [--blocks 1000000] [--workers 64] [--prompt-tokens 7800]
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass

from node.routing.approx_tree import ApproxTree
from node.routing.block_hashes import BlockHashes
from node.routing.cache_aware import CacheAware
from node.routing.kv_events import BlocksStored, KvEventBatch, StoredBlock
from node.routing.kv_index import KvIndex
from node.routing.policy import LoadView, RouteRequest

BLOCK = 16
SYSTEM_BLOCKS = 64  # a 1,024-token system prompt every conversation shares


@dataclass(slots=True)
class Worker:
    url: str
    in_flight: int = 0
    load: LoadView | None = None


class Corpus:
    """Token streams that never repeat a block except the shared system prompt."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)
        self.system = [self._rng.randrange(1, 150_000) for _ in range(SYSTEM_BLOCKS * BLOCK)]
        self._next = 1 << 20

    def conversation(self, tokens: int) -> list[int]:
        tail = tokens - len(self.system)
        start = self._next
        self._next += tail
        return self.system + list(range(start, start + tail))


def build_index(corpus: Corpus, blocks: int, workers: int, prompt_tokens: int) -> tuple[KvIndex, list[list[int]]]:
    index = KvIndex(max_blocks=blocks * 2)
    per_conversation = prompt_tokens // BLOCK
    conversations: list[list[int]] = []
    engine_hash = 0
    sequence = [0] * workers
    stored = 0
    while stored < blocks:
        w = len(conversations) % workers
        ids = corpus.conversation(prompt_tokens)
        conversations.append(ids)
        chain = []
        for b in range(per_conversation):
            engine_hash += 1
            chain.append(StoredBlock(engine_hash, tuple(ids[b * BLOCK : (b + 1) * BLOCK])))
        sequence[w] += 1
        index.apply(f"w{w}", KvEventBatch(sequence[w], (BlocksStored(tuple(chain), None, BLOCK),)))
        stored += per_conversation
    return index, conversations


def cpu_us(fn: Callable[[], object], samples: int) -> list[float]:
    for _ in range(min(50, samples)):
        fn()
    out = []
    gc.disable()
    try:
        for _ in range(samples):
            t0 = time.thread_time_ns()
            fn()
            out.append((time.thread_time_ns() - t0) / 1000)
    finally:
        gc.enable()
    return out


def report(label: str, values: list[float]) -> None:
    values = sorted(values)
    q = statistics.quantiles(values, n=100)
    print(f"{label:<46} {values[0]:>8.1f} {q[49]:>8.1f} {q[89]:>8.1f} {q[98]:>8.1f}")


def bytes_per_block(prompt_tokens: int, workers: int) -> tuple[float, float]:
    """(measured, estimated) bytes per indexed block, on a 100,000-block build."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    index, conversations = build_index(Corpus(7), 100_000, workers, prompt_tokens)
    del conversations  # only the index's own tables count
    gc.collect()
    measured = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    stats = index.stats()
    return measured / stats.blocks, stats.bytes_estimate / stats.blocks


def bytes_per_page(prompt_tokens: int) -> float:
    corpus = Corpus(11)
    prompts = [corpus.conversation(prompt_tokens) for _ in range(200)]
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    tree = ApproxTree(BLOCK, 1 << 30)
    for i, p in enumerate(prompts):
        tree.insert(BlockHashes(p, BLOCK), f"w{i % 8}")
    gc.collect()
    measured = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return measured / len(tree)


def latencies(args: argparse.Namespace) -> None:
    corpus = Corpus(1)
    t0 = time.process_time()
    index, conversations = build_index(corpus, args.blocks, args.workers, args.prompt_tokens)
    build_s = time.process_time() - t0
    stats = index.stats()
    print(
        f"index: {stats.blocks:,} blocks, {stats.prefixes:,} prefixes, {stats.workers} workers, "
        f"~{stats.bytes_estimate / 2**20:,.0f} MiB estimated, built in {build_s:.1f} s CPU "
        f"({build_s / stats.blocks * 1e6:.2f} us/block)"
    )
    held = conversations[len(conversations) // 2]  # one worker holds it all
    half = len(held) // 2
    partial = held[:half] + corpus.conversation(args.prompt_tokens)[half:]
    miss = list(range(10, 10 + args.prompt_tokens))
    assert max(index.match(held).values()) == args.prompt_tokens // BLOCK, "the full hit must match every block"

    print(f"\nCPU per call, us ({args.samples} samples)            {'min':>8} {'p50':>8} {'p90':>8} {'p99':>8}")
    report(f"KvIndex.match, full hit ({len(held)} tokens)", cpu_us(lambda: index.match(held), args.samples))
    report("KvIndex.match, shared prefix then half", cpu_us(lambda: index.match(partial), args.samples))
    report("KvIndex.match, miss", cpu_us(lambda: index.match(miss), args.samples))

    workers = [Worker(f"w{i}") for i in range(args.workers)]
    publishing = cache_aware(index)
    report(
        f"CacheAware.select, {args.workers} publishing workers",
        cpu_us(lambda: publishing.select(workers, RouteRequest(held)), args.samples),
    )
    guessing = cache_aware(None)

    def route_and_learn() -> None:
        request = RouteRequest(held)
        guessing.on_routed(guessing.select(workers, request), request)

    report("CacheAware select+on_routed, approximate tree", cpu_us(route_and_learn, args.samples))


def cache_aware(index: KvIndex | None) -> CacheAware:
    return CacheAware(
        cache_threshold=0.3,
        balance_abs_threshold=64,
        balance_rel_threshold=1.5,
        page_size_tokens=BLOCK,
        tree_max_pages=1 << 20,
        load_stale_after_s=30.0,
        kv_index=index,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=7800)
    parser.add_argument("--samples", type=int, default=2000)
    args = parser.parse_args()
    numbers = list(range(10_000))
    reference = min(cpu_us(lambda: sum(numbers), 200))
    print(
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; "
        f"reference: sum() of 10,000 ints takes {reference:.1f} us CPU here (compare machines by it)"
    )
    latencies(args)
    gc.collect()
    measured, estimated = bytes_per_block(args.prompt_tokens, args.workers)
    print(f"\nKvIndex memory: {measured:.0f} B/block measured (tracemalloc), {estimated:.0f} B/block estimated")
    print(f"ApproxTree memory: {bytes_per_page(args.prompt_tokens):.0f} B/page measured (tracemalloc)")


if __name__ == "__main__":
    main()
