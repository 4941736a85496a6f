"""CPU work off the event loop. Tokenizers release the GIL, so a small thread pool runs them in parallel
with the loop; tiny inputs run inline because a thread hop (~50 µs) would cost more than the work."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")

# Below this many characters of input, encoding takes well under 1 ms: run it inline.
INLINE_MAX_CHARS = 2048


class CpuPool:
    def __init__(self, threads: int) -> None:
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="smg-cpu")

    async def run(self, size_hint: int, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """Run ``fn`` inline when ``size_hint`` (chars of input) is small, else on the pool."""
        if size_hint <= INLINE_MAX_CHARS:
            return fn(*args, **kwargs)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: fn(*args, **kwargs))

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
