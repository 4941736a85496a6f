"""The Dispatch stage: run one generate spec on the workers and feed what they send to its Output stage.

Here and nowhere else: worker selection (the pool's policy), the prefill/decode split, retries on another
worker (``RetryPolicy``: only before anything came back, only for faults another worker may not have, after
a full-jitter pause, excluding the workers tried), each stream's deadlines (request, first token, idle;
tightened by the client SDK's timeout headers, applied where the worker's breaker sees them), the worker
contract (``WorkerContract``: never more than max_tokens per choice, ids inside the vocabulary, sane counts),
in-flight accounting, and aborting the worker request when it is no longer wanted (every choice ended before
the worker said so, the contract cut it, or the consumer left: closing the generator cancels the RPC and
sends Abort). The Output stage decides what the tokens mean; Dispatch only moves and polices them.

The continue step (node/pipeline/continuation.py) is here too: when the Output stage pauses its choice (a
reasoning budget ran out inside the block), the stream is aborted and the choice continues on a worker
request of its own, chosen, retried and policed as any other; the client reads one answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from opentelemetry.trace import INVALID_SPAN, Span

from node.errors import WorkerFailed, WorkerIncomplete, WorkerProtocolError
from node.pipeline.continuation import continuation_spec
from node.pipeline.events import Event, EventSink
from node.pipeline.output import OutputProcessor
from node.pipeline.spec import GenerateSpec
from node.pipeline.worker_contract import ContractLimits, WorkerContract
from node.routing.policy import RouteRequest
from node.telemetry import record
from node.telemetry.spans import end_generate_span, generate_span, routing_span, span_headers
from node.workers.breaker_client import blame
from node.workers.client import worker_batches
from node.workers.deadlines import DeadlineConfig, Deadlines, deadlines_for
from node.workers.pool import Worker, WorkerPool
from node.workers.retry import RetryPolicy
from node.workers.types import Push, Pushed, WorkerOutput, WorkerRequest

log = logging.getLogger(__name__)

#: After a worker's last message, wait this long for the end of its stream before cancelling the call.
END_OF_STREAM_GRACE_S = 1.0
#: What a prefill request asks of the engine's KV connector (vLLM's NIXL convention): keep the KV for a
#: remote decode. The engine's answer names where it is; that goes verbatim to the decode worker.
PREFILL_KV_TRANSFER = '{"do_remote_decode": true, "do_remote_prefill": false}'


@dataclass(frozen=True, slots=True)
class DispatchConfig:
    """How Dispatch treats workers: built once from the node's config (the retry policy holds its rng)."""

    retry: RetryPolicy
    deadlines: DeadlineConfig = field(default_factory=DeadlineConfig)
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
    """One spec on the workers. Iterate ``events()`` once.

    ``client_timeouts``: the request's headers, of which the client SDKs' timeout hints tighten the
    deadlines (node.workers.deadlines); looked up case-insensitively.
    """

    def __init__(
        self,
        spec: GenerateSpec,
        output: OutputProcessor,
        *,
        pool: WorkerPool,
        config: DispatchConfig,
        client_timeouts: Mapping[str, str] | None = None,
    ) -> None:
        self._origin = spec  # as Prepare made it
        self._spec = spec  # the current stream's: a continuation's after a continue step
        self._output = output
        self._pool = pool
        self._config = config
        deadlines = deadlines_for(config.deadlines, client_timeouts or {}, client_stream=spec.client_stream)
        # None when nothing bounds the stream: the breaker client then adds no deadline layer at all.
        bounded = deadlines.request or deadlines.first_token or deadlines.idle
        self._deadlines: Deadlines | None = deadlines if bounded else None
        self.worker_url: str | None = None
        self.prefill_url: str | None = None  # the prefill worker, in PD disaggregation

    async def events(
        self, *, final: Callable[[], list[Event]] | None = None, sink: EventSink | None = None
    ) -> AsyncGenerator[list[Event], None]:
        """Yield the Output stage's events per batch of worker messages, then ``final()`` (if given) once the
        spec ended normally. Raises NoHealthyWorker, WorkerFailed (WorkerTimeout, WorkerProtocolError, ...)
        once retrying is over or not allowed.

        ``sink``: the streamed tokens' events go to it as they arrive whenever it is ready (the push path),
        the rest are yielded; the consumer sees every event once, in order, either way."""
        pool, retry, output = self._pool, self._config.retry, self._output
        rec = record.current()
        tried: set[str] = set()
        attempt = 0
        steps = 0  # continue steps taken
        while True:
            spec = self._spec
            attempt += 1
            route = RouteRequest(
                prompt_ids=spec.prompt_ids, routing_key=spec.routing_key, model=spec.model, exclude=frozenset(tried)
            )
            kv_transfer: str | None = None
            if pool.disaggregated(spec.model):
                with routing_span(rec, pool, attempt, role="prefill") as routed:
                    prefill = routed(pool.select(route, role="prefill"))
                self.prefill_url = prefill.url
                try:
                    kv_transfer = await self._prefill_on(prefill)
                except WorkerFailed as exc:
                    rec.failed(prefill.url, exc)
                    pause = retry.next_pause(exc, attempt=attempt, received=False)
                    if pause is None:
                        raise
                    await self._before_retry(prefill, exc, pause, tried)
                    continue
                with routing_span(rec, pool, attempt, role="decode") as routed:
                    worker = routed(pool.select(route, role="decode"))
            else:
                with routing_span(rec, pool, attempt) as routed:
                    worker = routed(pool.select(route))
            rec.routed(worker.url, pool.policy_name, spec.model)
            self.worker_url = worker.url
            received = False
            span = generate_span(rec, worker.url, spec)
            try:
                # aclosing: when our consumer leaves, the worker stream is closed (and aborted) now, not at GC.
                async with contextlib.aclosing(self._attempt(worker, kv_transfer, span, sink)) as batches:
                    async for batch in batches:
                        received = True
                        yield batch
            except WorkerFailed as exc:
                rec.failed(worker.url, exc)
                span.record_exception(exc)
                # ``received`` is this stream's: a continuation that failed before its first token is retried
                # like a fresh request (what the client already has is in the continuation's prompt).
                pause = retry.next_pause(exc, attempt=attempt, received=received)
                if pause is None:
                    raise
                await self._before_retry(worker, exc, pause, tried)
                continue
            finally:
                end_generate_span(span, rec, output.usage)
            if output.paused:  # the stream was aborted at the pause: the continue step
                steps += 1
                events, produced = output.resume()
                if events:
                    yield events
                if not output.complete:
                    self._spec = continuation_spec(self._origin, produced, steps)
                    attempt, tried = 0, set()  # a new stream: its own retries
                    log.debug("request %s: continued as %s", spec.request_id, self._spec.request_id)
                    continue
            if final is not None:
                yield final()
            return

    async def _before_retry(self, worker: Worker, exc: WorkerFailed, pause_s: float, tried: set[str]) -> None:
        """Take ``worker`` out of rotation (until a health check passes), remember it, wait ``pause_s``."""
        self._pool.report_failure(worker, exc)
        tried.add(worker.url)
        log.info("request %s: retrying on another worker in %.3f s: %s", self._spec.request_id, pause_s, exc.message)
        await asyncio.sleep(pause_s)

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
            deadlines=self._deadlines,
        )
        output = self._output
        usage = output.usage
        handed: str | None = None
        finished = False
        worker.in_flight += 1
        worker.dispatched += 1
        stream = worker.client.generate(request)
        try:
            async for out in stream:
                if not output.continued:  # a continuation's cache reads are not the client's input
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

    async def _attempt(
        self, worker: Worker, kv_transfer: str | None, span: Span = INVALID_SPAN, sink: EventSink | None = None
    ) -> AsyncGenerator[list[Event], None]:
        """One try on ``worker``: its stream through the worker contract and the Output stage, in-flight
        counted, aborted unless the worker finished by itself. With ``sink``, the same steps also run as the
        worker's push (``push`` below) for the messages that need nothing asynchronous."""
        spec, output = self._spec, self._output
        params = spec.params
        rec = record.current()
        limits = ContractLimits(
            max_tokens=params.max_tokens,
            n=params.n,
            prompt_tokens=len(spec.prompt_ids),
            vocab_size=spec.vocab_size,
            stream=output.worker_streams,
        )
        contract = WorkerContract(limits, url=worker.url)
        got_any = False
        push: Push | None = None
        if sink is not None and output.worker_streams:

            def push(outs: Sequence[WorkerOutput]) -> Pushed:
                """This loop's step for streamed chunks, run as they arrive. Declines (changing nothing) what
                the loop must handle (a finish, a contract fault, an output already complete or paused) and
                while the sink cannot send at once; wakes the loop when the output completed or paused."""
                nonlocal got_any
                if output.complete or output.paused or not sink.ready() or not contract.passes_chunks(outs):
                    return Pushed.DECLINED
                got_any = True
                tokens = 0
                for out in outs:
                    tokens += len(out.token_ids)
                rec.tokens(tokens)
                events = output.feed(outs)
                if events:
                    sink.take(events)
                return Pushed.TAKEN_WAKE if output.complete or output.paused else Pushed.TAKEN

        request = WorkerRequest(
            request_id=spec.request_id,
            prompt_ids=spec.prompt_ids,
            params=params,
            stream=output.worker_streams,
            kv_transfer_params_json=kv_transfer,
            deadlines=self._deadlines,
            trace_headers=span_headers(span),
            push=push,
        )
        worker.in_flight += 1
        worker.dispatched += 1
        worker_done = False
        stream = worker_batches(worker.client, request)
        try:
            async for outs in stream:
                got_any = True
                if not outs:
                    # The push completed or paused the output (it sent the events): end as below.
                    checked: Sequence[WorkerOutput] = outs
                    cut = False
                    tokens = 0
                # One message that breaks no rule (the common case) passes without building anything.
                elif len(outs) == 1 and contract.passes(outs[0]):
                    checked = outs
                    cut = False
                    tokens = len(outs[0].token_ids)
                else:
                    checked, cut, tokens = _police(contract, outs)
                # Token arrival times for TTFT and time per output token (node/telemetry/record.py).
                rec.tokens(tokens)
                # Messages that arrived together become one list of events: one write to the client.
                events = output.feed(checked)
                if events:
                    yield events
                if cut:
                    # The worker overran max_tokens: what it was allowed went out, its choice finished
                    # "length"; it gets no more of this request and its breaker counts the fault.
                    overran = WorkerProtocolError(f"worker {worker.url} sent more than max_tokens={params.max_tokens}")
                    if not output.complete:
                        raise overran
                    await blame(stream, overran)
                    break
                if output.complete or output.paused:
                    # Every choice ended (stop string, EOS, length) or waits for the continue step (events());
                    # the worker is done only if it said so, else it is aborted below.
                    worker_done = output.worker_done
                    if worker_done:
                        await _read_to_end(stream, self._config.end_of_stream_grace_s)
                    break
            else:
                worker_done = True
                if not output.complete:
                    raise WorkerIncomplete(f"worker {worker.url} ended the stream before finishing every choice")
        except WorkerFailed as exc:
            worker_done = not got_any  # nothing started there: nothing to abort
            await blame(stream, exc)  # a fault we found in the stream counts against the worker's circuit
            raise
        finally:
            await stream.aclose()
            worker.in_flight -= 1
            if not worker_done:
                self._pool.abort_soon(worker, spec.request_id)


def _police(contract: WorkerContract, outs: Sequence[WorkerOutput]) -> tuple[Sequence[WorkerOutput], bool, int]:
    """The messages the contract lets through (possibly cut), whether it cut the stream, and how many ids they
    carry. Raises WorkerProtocolError. Messages that break no rule pass as they are: no verdict is built."""
    checked: list[WorkerOutput] = []
    tokens = 0
    for out in outs:
        if contract.passes(out):
            checked.append(out)
            tokens += len(out.token_ids)
            continue
        verdict = contract.check(out)
        checked.extend(verdict.outputs)
        tokens += sum(len(o.token_ids) for o in verdict.outputs)
        if verdict.abort_stream:
            return checked, True, tokens  # nothing after the cut is relayed
    return checked, False, tokens
