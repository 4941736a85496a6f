"""Progress lines for waits an operator would otherwise watch in silence (a worker that does not answer, a
peer that is down): nothing for a wait under ``FIRST_AFTER_S``, then a line every ``EVERY_S``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

log = logging.getLogger("smg-node")

# A wait shorter than this is not worth a line; longer, silence reads as a hang.
FIRST_AFTER_S = 1.0
# Often enough to show the process is alive, rarely enough to stay readable.
EVERY_S = 2.0


@contextlib.asynccontextmanager
async def reporting(
    line: Callable[[float], str], *, first_after_s: float = FIRST_AFTER_S, every_s: float = EVERY_S
) -> AsyncIterator[None]:
    """Within the block, log ``line(elapsed_s)`` after ``first_after_s`` and then every ``every_s``."""
    loop = asyncio.get_running_loop()
    started = loop.time()

    async def report() -> None:
        await asyncio.sleep(first_after_s)
        while True:
            log.info("%s", line(loop.time() - started))
            await asyncio.sleep(every_s)

    task = asyncio.create_task(report(), name="progress")
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
