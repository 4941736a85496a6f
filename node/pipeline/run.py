"""One prepared request running: a Dispatch (with its Output stage) per prompt, their events merged.

The Completions API's batch of prompts fans out here, not in the HTTP layer: each prompt's generation runs
as its own task and its events come out as they arrive, choices already numbered across the request.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable, Mapping

from node.pipeline.dispatch import Dispatch, DispatchConfig
from node.pipeline.events import Event, EventSink, Usage
from node.pipeline.output import OutputProcessor, Stages
from node.pipeline.spec import Prepared
from node.workers.pool import WorkerPool


def _ignore_usage(usage: Usage) -> None:
    return None


class Run:
    """Iterate ``events()`` once: lists of events (one client write each), the last one ``[Usage]`` when
    the run ended normally. Raises NoHealthyWorker, WorkerFailed."""

    def __init__(
        self,
        prepared: Prepared,
        *,
        pool: WorkerPool,
        dispatch: DispatchConfig,
        stages: Stages | None = None,
        on_usage: Callable[[Usage], None] = _ignore_usage,
        client_timeouts: Mapping[str, str] | None = None,
    ) -> None:
        tokenizer = prepared.model.tokenizer
        n = prepared.params.n
        self._outputs = [
            OutputProcessor(spec, tokenizer, index_offset=k * n, stages=stages) for k, spec in enumerate(prepared.specs)
        ]
        self.dispatches = [
            Dispatch(spec, output, pool=pool, config=dispatch, client_timeouts=client_timeouts)
            for spec, output in zip(prepared.specs, self._outputs, strict=True)
        ]
        self._on_usage = on_usage

    @property
    def usage(self) -> Usage:
        """Tokens so far, summed over the prompts (final once ``events()`` is exhausted)."""
        if len(self._outputs) == 1:
            return self._outputs[0].usage
        total = Usage(prompt_tokens=0)
        for output in self._outputs:
            total.prompt_tokens += output.usage.prompt_tokens
            total.completion_tokens += output.usage.completion_tokens
            total.cached_tokens += output.usage.cached_tokens
            total.reasoning_tokens += output.usage.reasoning_tokens
        return total

    def events(self, *, sink: EventSink | None = None) -> AsyncGenerator[list[Event], None]:
        """``sink``: takes the streamed tokens' events as they arrive when it can (Dispatch.events); only a
        run of one prompt pushes (a batch's prompts are merged through a queue)."""
        # One prompt (the usual case): Dispatch's own generator, with no layer of ours per batch.
        if len(self.dispatches) == 1:
            return self.dispatches[0].events(final=self._final, sink=sink)
        return self._merged()

    def _final(self) -> list[Event]:
        """The last batch of a run that ended normally: its usage (told to the metrics hook first)."""
        usage = self.usage
        self._on_usage(usage)
        return [usage]

    async def _merged(self) -> AsyncGenerator[list[Event], None]:
        """The dispatches' events as they come, each dispatch pumped by its own task (owned here: cancelled
        and awaited when the consumer leaves or one fails)."""
        queue: asyncio.Queue[list[Event] | BaseException | None] = asyncio.Queue()

        async def pump(dispatch: Dispatch) -> None:
            try:
                async with contextlib.aclosing(dispatch.events()) as it:
                    async for batch in it:
                        await queue.put(batch)
                await queue.put(None)
            except Exception as exc:
                await queue.put(exc)

        tasks = [asyncio.create_task(pump(d), name=f"generation-{k}") for k, d in enumerate(self.dispatches)]
        try:
            remaining = len(tasks)
            while remaining:
                item = await queue.get()
                if item is None:
                    remaining -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield item
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        yield self._final()
