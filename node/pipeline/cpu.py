"""CPU work off the event loop. Tokenizers release the GIL, so a small thread pool runs them in parallel
with the loop; tiny inputs run inline because a thread hop (~50 µs) would cost more than the work.

Sizing by the work actually left matters: a chat turn whose history the tokenizer cache already holds
encodes only its new suffix (~50 µs for a 12,000-character prompt), and sending it to a thread costs more
than that: the hop itself, and the GIL convoy it starts (the loop, releasing the GIL in every syscall,
then waits for the thread's Python code to hand it back).
"""

from __future__ import annotations

import asyncio
import threading
from array import array
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from node.pipeline.tokenizer import Tokenizer
from node.telemetry import record
from node.telemetry.spans import stage_span

P = ParamSpec("P")
R = TypeVar("R")

# Below this many characters of input, encoding takes well under 1 ms: run it inline.
INLINE_MAX_CHARS = 2048
# Chat templates render in ~2.5 µs per 1,000 characters: below this, rendering on the loop stays under
# ~0.1 ms, and the cache lookup that follows it (hashing, ~1 µs per 1,000 characters) decides the rest.
RENDER_INLINE_MAX_CHARS = 32768
# The cache lookup hashes the whole text (~1 µs per 1,000 characters, plus the L0 key's str hash): above
# this, even the lookup goes to the pool with the encode, so no request holds the loop for long.
LOOKUP_INLINE_MAX_CHARS = 131072


# Bounds the start-up wait for every pool thread to be running (they start in milliseconds).
_WARM_TIMEOUT_S = 60.0


class CpuPool:
    def __init__(self, threads: int) -> None:
        self._threads = threads
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="smg-cpu")

    async def warm(self, fn: Callable[[], object]) -> None:
        """Start every thread of the pool and run ``fn`` once on each (e.g. a tokenizer's
        `Tokenizer.warm_this_thread`, ~0.1 s per thread), so no request pays for it. Each call waits until
        all the pool's threads hold one, so the pool has to start them all."""
        barrier = threading.Barrier(self._threads, timeout=_WARM_TIMEOUT_S)

        def on_one_thread() -> None:
            barrier.wait()
            fn()

        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(self._executor, on_one_thread) for _ in range(self._threads)))

    async def run(self, size_hint: int, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """Run ``fn`` inline when ``size_hint`` (chars of input) is small, else on the pool."""
        if size_hint <= INLINE_MAX_CHARS:
            return fn(*args, **kwargs)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: fn(*args, **kwargs))

    async def encode(self, tokenizer: Tokenizer, text: str, *, add_special_tokens: bool) -> array[int]:
        """``tokenizer.encode_ids``: the cache lookup inline, the encoding it leaves inline or on the pool by
        its size."""
        if len(text) > LOOKUP_INLINE_MAX_CHARS:
            return await self.run(len(text), lambda: tokenizer.encode_ids(text, add_special_tokens=add_special_tokens))
        job = tokenizer.prepare(text, add_special_tokens=add_special_tokens)
        return await self.run(job.pending_chars, job.ids)

    async def render_and_encode(self, size_hint: int, render: Callable[[], str], tokenizer: Tokenizer) -> array[int]:
        """Ids of a chat prompt (no special tokens added: the template wrote them). ``render`` makes the
        text from messages of ``size_hint`` characters: inline when small, then `encode`; for very long
        conversations both on the pool."""
        with stage_span(record.current(), "template+tokenize", chars=size_hint) as span:
            if size_hint > RENDER_INLINE_MAX_CHARS:
                ids = await self.run(size_hint, lambda: tokenizer.encode_ids(render(), add_special_tokens=False))
            else:
                ids = await self.encode(tokenizer, render(), add_special_tokens=False)
            span.set_attribute("gen_ai.usage.input_tokens", len(ids))
            return ids

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
