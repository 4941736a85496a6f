"""A worker's SubscribeKvEvents stream feeding the KV index of the model it serves (cache_aware routing)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from node.errors import KvEventsUnsupported, WorkerFailed
from node.routing.kv_index import Resubscribe
from node.routing.kv_indexes import KvIndexes
from node.workers.worker import Worker, set_load

log = logging.getLogger(__name__)

# A broken KV-event stream is retried after this pause, doubling up to the cap.
KV_RETRY_MIN_S = 0.5
KV_RETRY_MAX_S = 30.0


async def follow_kv_events(
    worker: Worker,
    indexes: KvIndexes,
    *,
    model_of: Callable[[Worker], str | None] | None,
    recheck_s: float,
) -> None:
    """Feed its model's index from the worker's KV events, resubscribing after gaps and broken streams, until
    cancelled or the worker says it publishes none. ``model_of`` as WorkerPool's (None: one index for all);
    a worker whose model is not known yet is looked at again every ``recheck_s``."""

    def indexed_model() -> tuple[bool, str | None]:
        """(known, model): the model whose KV index ``worker`` feeds; not known before its model is."""
        if model_of is None:
            return True, None
        model = model_of(worker)
        return model is not None, model

    pause = KV_RETRY_MIN_S
    while True:
        known, model = indexed_model()
        if not known:  # a worker's model is learned at a health check (or once the models are loaded)
            await asyncio.sleep(recheck_s)
            continue
        index = indexes.of(model)
        try:
            again = False
            async for batch, load in worker.client.kv_events(index.resume_from(worker.url)):
                worker.kv_events = "streaming"
                pause = KV_RETRY_MIN_S
                if load is not None:
                    worker.stream_loads = True
                    set_load(worker, load)
                if indexed_model() != (True, model):  # re-registered for another model
                    log.info("worker %s now serves another model: resubscribing", worker.url)
                    index.forget_worker(worker.url)
                    again = True
                    break
                if batch is not None and isinstance(index.apply(worker.url, batch), Resubscribe):
                    log.info("KV events of %s skipped batches: resubscribing", worker.url)
                    again = True
                    break
            if not again:  # the worker ended the stream: reconnect, but never in a tight loop
                await asyncio.sleep(pause)
                pause = min(pause * 2, KV_RETRY_MAX_S)
        except KvEventsUnsupported:
            worker.kv_events = "unsupported"
            log.info("worker %s publishes no KV events: routing learns from its own decisions", worker.url)
            return
        except WorkerFailed as exc:
            worker.kv_events = "retrying"
            log.debug("KV events of %s: %s", worker.url, exc.message)
            await asyncio.sleep(pause)
            pause = min(pause * 2, KV_RETRY_MAX_S)
