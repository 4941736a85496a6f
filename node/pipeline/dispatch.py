"""The Dispatch stage: run one generate spec on the workers and feed what they send to its Output stage.

Here and nowhere else: worker selection (the pool's policy), the prefill/decode split, retries on another
worker, in-flight accounting, and aborting the worker request when it is no longer wanted (every choice
ended before the worker said so, or the consumer left: closing the generator cancels the RPC and sends
Abort). The Output stage decides what the tokens mean; Dispatch only moves them.

Seams for the worker contract (node/pipeline/worker_contract.py, node/workers/deadlines.py and retry.py
of the `contract` work): ``DispatchConfig`` is where deadlines and retry backoff get their bounds;
``_attempt`` is the one place a worker's stream is read (time-to-first-token and inter-token deadlines
wrap its ``anext``); the retry loop in ``events`` is where backoff goes; ``OutputProcessor.feed`` is where
per-message contract checks raise WorkerFailed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, replace

from node.errors import WorkerFailed
from node.pipeline.events import Event
from node.pipeline.output import OutputProcessor
from node.pipeline.spec import GenerateSpec
from node.routing.policy import RouteRequest
from node.workers.client import worker_batches
from node.workers.pool import Worker, WorkerPool
from node.workers.types import WorkerOutput, WorkerRequest

log = logging.getLogger(__name__)

# A worker that cannot be reached before it produced anything is retried on another one, this many times.
MAX_CONNECT_ATTEMPTS = 2
#: After a worker's last message, wait this long for the end of its stream before cancelling the call.
END_OF_STREAM_GRACE_S = 1.0
#: What a prefill request asks of the engine's KV connector (vLLM's NIXL convention): keep the KV for a
#: remote decode. The engine's answer names where it is; that goes verbatim to the decode worker.
PREFILL_KV_TRANSFER = '{"do_remote_decode": true, "do_remote_prefill": false}'


@dataclass(frozen=True, slots=True)
class DispatchConfig:
    # Workers tried for one spec when they fail before producing anything.
    max_attempts: int = MAX_CONNECT_ATTEMPTS
    # Grace for the end of a finished worker's stream (its trailers) before the call is cancelled.
    end_of_stream_grace_s: float = END_OF_STREAM_GRACE_S


async def _read_to_end(stream: AsyncGenerator[Sequence[WorkerOutput], None], grace_s: float) -> None:
    """Read a finished worker's stream to its end (the gRPC trailers follow its last message at once), so
    the call completes rather than being cancelled (RST_STREAM) after its last message; bounded."""
    try:
        async with asyncio.timeout(grace_s):
            async for _ in stream:
                pass
    except (TimeoutError, WorkerFailed):
        pass  # closing the stream cancels it: the answer is complete either way


class Dispatch:
    """One spec on the workers. Iterate ``events()`` once."""

    def __init__(
        self, spec: GenerateSpec, output: OutputProcessor, *, pool: WorkerPool, config: DispatchConfig
    ) -> None:
        self._spec = spec
        self._output = output
        self._pool = pool
        self._config = config
        self.worker_url: str | None = None
        self.prefill_url: str | None = None  # the prefill worker, in PD disaggregation

    async def events(self) -> AsyncGenerator[list[Event], None]:
        """Yield the Output stage's events per batch of worker messages. Raises NoHealthyWorker, WorkerFailed."""
        spec, pool = self._spec, self._pool
        route = RouteRequest(prompt_ids=spec.prompt_ids, routing_key=spec.routing_key, model=spec.model)
        attempts = self._config.max_attempts
        for attempt in range(1, attempts + 1):
            kv_transfer: str | None = None
            if pool.disaggregated(spec.model):
                prefill = pool.select(route, role="prefill")
                self.prefill_url = prefill.url
                try:
                    kv_transfer = await self._prefill_on(prefill)
                except WorkerFailed as exc:
                    if attempt == attempts:
                        raise
                    pool.report_failure(prefill, exc)
                    continue
                worker = pool.select(route, role="decode")
            else:
                worker = pool.select(route)
            self.worker_url = worker.url
            received = False
            try:
                # aclosing: when our consumer leaves, the worker stream is closed (and aborted) now, not at GC.
                async with contextlib.aclosing(self._attempt(worker, kv_transfer)) as batches:
                    async for batch in batches:
                        received = True
                        yield batch
                return
            except WorkerFailed as exc:
                if received or attempt == attempts:
                    raise
                pool.report_failure(worker, exc)
                log.info("request %s: retrying on another worker: %s", spec.request_id, exc.message)

    async def _prefill_on(self, worker: Worker) -> str:
        """PD disaggregation, step one: run the prompt's prefill on ``worker`` (one token, not streamed) and
        return the kv_transfer_params_json its GenerateComplete hands to the decode worker."""
        spec = self._spec
        request = WorkerRequest(
            request_id=f"{spec.request_id}-prefill",
            prompt_ids=spec.prompt_ids,
            params=replace(
                spec.params, max_tokens=1, min_tokens=0, n=1, logprobs=None, stop_token_ids=(), ignore_eos=True
            ),
            stream=False,
            kv_transfer_params_json=PREFILL_KV_TRANSFER,
        )
        usage = self._output.usage
        handed: str | None = None
        finished = False
        worker.in_flight += 1
        stream = worker.client.generate(request)
        try:
            async for out in stream:
                usage.cached_tokens = max(usage.cached_tokens, out.cached_tokens)
                if out.kv_transfer_params_json:
                    handed = out.kv_transfer_params_json
            finished = True
        except WorkerFailed:
            finished = True  # nothing to abort on a worker that failed
            raise
        finally:
            await stream.aclose()
            worker.in_flight -= 1
            if not finished:  # our consumer left during the prefill
                self._pool.abort_soon(worker, request.request_id)
        if handed is None:
            raise WorkerFailed(f"prefill worker {worker.url} returned no kv_transfer_params")
        return handed

    async def _attempt(self, worker: Worker, kv_transfer: str | None) -> AsyncGenerator[list[Event], None]:
        """One try on ``worker``: its stream through the Output stage, in-flight counted, aborted unless the
        worker finished by itself."""
        output = self._output
        request = WorkerRequest(
            request_id=self._spec.request_id,
            prompt_ids=self._spec.prompt_ids,
            params=self._spec.params,
            stream=output.worker_streams,
            kv_transfer_params_json=kv_transfer,
        )
        worker.in_flight += 1
        worker_done = False
        got_any = False
        stream = worker_batches(worker.client, request)
        try:
            async for outs in stream:
                got_any = True
                # Messages that arrived together become one list of events: one write to the client.
                events = output.feed(outs)
                if events:
                    yield events
                if output.complete:
                    # Every choice ended (stop string, EOS, length); the worker is done only if it said so.
                    worker_done = output.worker_done
                    if worker_done:
                        await _read_to_end(stream, self._config.end_of_stream_grace_s)
                    break
            else:
                worker_done = True
                if not output.complete:
                    raise WorkerFailed(f"worker {worker.url} ended the stream before finishing every choice")
        except WorkerFailed:
            worker_done = not got_any  # nothing started there: nothing to abort
            raise
        finally:
            await stream.aclose()
            worker.in_flight -= 1
            if not worker_done:
                self._pool.abort_soon(worker, self._spec.request_id)
