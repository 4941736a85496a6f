"""One generation: send token ids to a worker, turn the ids that stream back into text deltas per choice.

The gateway, not the engine, decides where each answer ends: stop strings (matched on detokenized text across
token boundaries), EOS and stop_token_ids. When every choice has ended before the worker says so, the worker
request is aborted. The same happens when the consumer goes away (client disconnect): closing the generator
cancels the RPC and sends Abort. Usage counts only the tokens the client's answer consumed, so it is exact
even when the gateway cut the answer short.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field, replace

from opentelemetry.trace import INVALID_SPAN, Span

from node.errors import WorkerAborted, WorkerFailed, WorkerIncomplete, WorkerProtocolError
from node.pipeline.detokenize import IncrementalDetokenizer
from node.pipeline.stops import StopMatcher, StopSet
from node.pipeline.tokenizer import Tokenizer
from node.routing.policy import RouteRequest
from node.telemetry import record
from node.telemetry.spans import end_generate_span, generate_span, routing_span, span_headers
from node.workers.breaker_client import blame
from node.workers.client import worker_batches
from node.workers.pool import Worker, WorkerPool
from node.workers.types import SamplingParams, TokenLogprobs, WorkerOutput, WorkerRequest

log = logging.getLogger(__name__)

# A worker that cannot be reached before it produced anything is retried on another one, this many times.
MAX_CONNECT_ATTEMPTS = 2
#: After a worker's last message, wait this long for the end of its stream before cancelling the call.
END_OF_STREAM_GRACE_S = 1.0
#: What a prefill request asks of the engine's KV connector (vLLM's NIXL convention): keep the KV for a
#: remote decode. The engine's answer names where it is; that goes verbatim to the decode worker.
PREFILL_KV_TRANSFER = '{"do_remote_decode": true, "do_remote_prefill": false}'


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True)
class TextDelta:
    """New text for choice ``index``; ``finish_reason`` is set on the choice's last delta."""

    index: int
    text: str
    finish_reason: str | None = None
    logprobs: tuple[TokenLogprob, ...] = ()
    token_ids: tuple[int, ...] = ()


@dataclass(slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int = 0
    cached_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class GenerateSpec:
    request_id: str
    prompt_ids: Sequence[int]
    params: SamplingParams
    stops: tuple[str, ...] = ()
    include_stop_str: bool = False
    # Token ids that end an answer without being part of it (EOS unless ignore_eos, plus stop_token_ids).
    terminators: frozenset[int] = frozenset()
    routing_key: str | None = None
    # The served model the request names: only its workers are candidates (None: any worker).
    model: str | None = None
    # Keep per-token ids on deltas (the Completions API's echo/logprobs need them).
    want_token_ids: bool = False
    # Whether the client streams. A non-streaming answer without stop strings needs no early look at the
    # tokens, so the worker is asked for one final message instead of a stream (cheaper on both sides).
    client_stream: bool = True


@dataclass(slots=True)
class _Choice:
    detok: IncrementalDetokenizer
    stops: StopMatcher | None
    seen: int = 0  # ids received from the worker for this choice
    last_chunk: tuple[int, ...] = ()  # ids of the latest streamed chunk
    consumed: int = 0  # ids that count as completion tokens (<= seen)
    finish_reason: str | None = None
    pending_logprobs: list[TokenLogprob] = field(default_factory=list)


def _logprob_entries(lp: TokenLogprobs | None, start: int, count: int) -> list[TokenLogprob]:
    if lp is None:
        return []
    out: list[TokenLogprob] = []
    for k in range(start, min(start + count, len(lp.token_ids))):
        top: tuple[tuple[int, float], ...] = ()
        if k < len(lp.top_ids):
            top = tuple(zip(lp.top_ids[k], lp.top_logprobs[k], strict=False))
        out.append(TokenLogprob(lp.token_ids[k], lp.logprobs[k], top))
    return out


def _is_open(choice: _Choice) -> bool:
    return choice.finish_reason is None


async def _read_to_end(stream: AsyncGenerator[Sequence[WorkerOutput], None]) -> None:
    """Read a finished worker's stream to its end (the gRPC trailers follow its last message at once), so
    the call completes rather than being cancelled (RST_STREAM) after its last message; bounded."""
    try:
        async with asyncio.timeout(END_OF_STREAM_GRACE_S):
            async for _ in stream:
                pass
    except (TimeoutError, WorkerFailed):
        pass  # closing the stream cancels it: the answer is complete either way


class Generation:
    """Runs one request with n choices. Iterate ``deltas()`` once; read ``usage`` afterwards."""

    def __init__(self, spec: GenerateSpec, *, pool: WorkerPool, tokenizer: Tokenizer) -> None:
        self._spec = spec
        self._pool = pool
        self._tokenizer = tokenizer
        self.usage = Usage(prompt_tokens=len(spec.prompt_ids))
        n = spec.params.n
        stop_set = StopSet(spec.stops)  # built once, shared by the n choices' matchers
        self._choices = [
            _Choice(
                detok=IncrementalDetokenizer(
                    tokenizer.raw,
                    skip_special_tokens=spec.params.skip_special_tokens,
                    prompt_ids=spec.prompt_ids[-8:],
                ),
                stops=StopMatcher(stop_set, include_stop_str=spec.include_stop_str) if stop_set else None,
            )
            for _ in range(n)
        ]
        self._open = n
        self._worker_finished = 0  # choices the worker itself reported finished
        self._worker_streams = spec.client_stream or bool(spec.stops)
        # Per-token stepping is needed only to know exactly which token completed a stop string or to attach
        # logprobs/ids to the text they produced; otherwise whole chunks are detokenized at once.
        self._per_token = bool(spec.stops) or spec.params.logprobs is not None or spec.want_token_ids
        self.worker_url: str | None = None
        self.prefill_url: str | None = None  # the prefill worker, in PD disaggregation

    async def deltas(self) -> AsyncGenerator[list[TextDelta], None]:
        """Yield lists of deltas as the worker produces tokens. Raises NoHealthyWorker, WorkerFailed."""
        route = RouteRequest(
            prompt_ids=self._spec.prompt_ids, routing_key=self._spec.routing_key, model=self._spec.model
        )
        rec = record.current()
        for attempt in range(1, MAX_CONNECT_ATTEMPTS + 1):
            kv_transfer: str | None = None
            if self._pool.disaggregated(self._spec.model):
                prefill = self._pool.select(route, role="prefill")
                self.prefill_url = prefill.url
                try:
                    kv_transfer = await self._prefill_on(prefill)
                except WorkerFailed as exc:
                    if attempt == MAX_CONNECT_ATTEMPTS:
                        raise
                    self._pool.report_failure(prefill, exc)
                    continue
                with routing_span(rec, self._pool, attempt, role="decode") as routed:
                    worker = routed(self._pool.select(route, role="decode"))
            else:
                with routing_span(rec, self._pool, attempt) as routed:
                    worker = routed(self._pool.select(route))
            rec.routed(worker.url, self._pool.policy_name, self._spec.model)
            self.worker_url = worker.url
            received = False
            span = generate_span(rec, worker.url, self._spec)
            try:
                # aclosing: when our consumer leaves, the worker stream is closed (and aborted) now, not at GC.
                async with contextlib.aclosing(self._run_on(worker, kv_transfer, span)) as batches:
                    async for batch in batches:
                        received = True
                        yield batch
                return
            except WorkerFailed as exc:
                rec.failed(worker.url, exc)
                span.record_exception(exc)
                if received or attempt == MAX_CONNECT_ATTEMPTS:
                    raise
                self._pool.report_failure(worker, exc)
                log.info("request %s: retrying on another worker: %s", self._spec.request_id, exc.message)
            finally:
                end_generate_span(span, rec, self.usage)

    async def _prefill_on(self, worker: Worker) -> str:
        """PD disaggregation, step one: run the prompt's prefill on ``worker`` (one token, not streamed) and
        return the kv_transfer_params_json its GenerateComplete hands to the decode worker."""
        request = WorkerRequest(
            request_id=f"{self._spec.request_id}-prefill",
            prompt_ids=self._spec.prompt_ids,
            params=replace(
                self._spec.params, max_tokens=1, min_tokens=0, n=1, logprobs=None, stop_token_ids=(), ignore_eos=True
            ),
            stream=False,
            kv_transfer_params_json=PREFILL_KV_TRANSFER,
        )
        handed: str | None = None
        finished = False
        worker.in_flight += 1
        stream = worker.client.generate(request)
        try:
            async for out in stream:
                self.usage.cached_tokens = max(self.usage.cached_tokens, out.cached_tokens)
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

    async def _run_on(
        self, worker: Worker, kv_transfer: str | None = None, span: Span = INVALID_SPAN
    ) -> AsyncGenerator[list[TextDelta], None]:
        request = WorkerRequest(
            request_id=self._spec.request_id,
            prompt_ids=self._spec.prompt_ids,
            params=self._spec.params,
            stream=self._worker_streams,
            kv_transfer_params_json=kv_transfer,
            trace_headers=span_headers(span),
        )
        rec = record.current()
        worker.in_flight += 1
        worker_done = False
        got_any = False
        stream = worker_batches(worker.client, request)
        try:
            async for outs in stream:
                got_any = True
                # Messages that arrived together become one batch of deltas: one write to the client.
                batch: list[TextDelta] = []
                for out in outs:
                    if out.index >= len(self._choices):
                        raise WorkerProtocolError(
                            f"worker {worker.url} sent choice index {out.index} of n={len(self._choices)}"
                        )
                    self.usage.cached_tokens = max(self.usage.cached_tokens, out.cached_tokens)
                    rec.tokens(len(out.token_ids))
                    batch.extend(self._consume(out))
                if batch:
                    yield batch
                if self._open == 0:
                    # Every choice ended (stop string, EOS, length); the worker is done only if it said so.
                    worker_done = self._worker_finished == len(self._choices)
                    if worker_done:
                        await _read_to_end(stream)
                    break
            else:
                worker_done = True
                if self._open:
                    raise WorkerIncomplete(f"worker {worker.url} ended the stream before finishing every choice")
        except WorkerFailed as exc:
            worker_done = not got_any  # nothing started there: nothing to abort
            await blame(stream, exc)  # a fault we found in the stream counts against the worker's circuit
            raise
        finally:
            await stream.aclose()
            worker.in_flight -= 1
            if not worker_done:
                self._pool.abort_soon(worker, self._spec.request_id)

    def _consume(self, out: WorkerOutput) -> list[TextDelta]:
        choice = self._choices[out.index]
        if out.finish_reason is not None:
            self._worker_finished += 1
        if choice.finish_reason is not None:
            return []
        ids = out.token_ids
        start = 0
        if out.finish_reason is None:
            choice.last_chunk = tuple(ids)
        elif self._worker_streams and tuple(ids) == choice.last_chunk:
            # vLLM's servicer ends each streamed choice with a chunk and then a final message repeating that
            # chunk's ids (its output kind is DELTA): they are not new.
            start = len(ids)
        new_ids = list(ids) if start == 0 else []
        choice.seen += len(new_ids)
        logprobs = _logprob_entries(out.logprobs, start, len(new_ids)) if self._spec.params.logprobs is not None else []
        deltas: list[TextDelta] = []
        if self._per_token:
            for k, token in enumerate(new_ids):
                lp = (logprobs[k],) if k < len(logprobs) else ()
                delta = self._step(choice, out.index, [token], lp)
                if delta is not None:
                    deltas.append(delta)
                if not _is_open(choice):
                    break
        else:
            delta = self._step(choice, out.index, new_ids, ())
            if delta is not None:
                deltas.append(delta)
        if out.finish_reason is not None and _is_open(choice):
            reason = out.finish_reason
            if reason == "abort":
                raise WorkerAborted("the worker aborted the request")
            deltas.append(self._finish(choice, out.index, "length" if reason == "length" else "stop"))
        return deltas

    def _step(self, choice: _Choice, index: int, ids: list[int], lp: tuple[TokenLogprob, ...]) -> TextDelta | None:
        """Feed ids (one, when per-token) to a choice. Returns the delta to emit, if any."""
        # As in vLLM's stop checker, nothing ends an answer before min_tokens (the engine masks EOS and
        # stop_token_ids until then; stop strings are not matched until then either).
        armed = choice.consumed + len(ids) > self._spec.params.min_tokens
        terminators = self._spec.terminators
        cut: int | None = None
        if armed and not terminators.isdisjoint(ids):  # a set test in C first: the generator costs per token
            cut = next(k for k, t in enumerate(ids) if t in terminators)
        if cut is not None:
            # The terminator counts as generated (as engines count EOS) but is not part of the text.
            choice.consumed += cut + 1
            self.usage.completion_tokens += cut + 1
            text = choice.detok.step(ids[:cut]) if cut else ""
            final = self._finish(choice, index, "stop", text, lp)
            return final
        choice.consumed += len(ids)
        self.usage.completion_tokens += len(ids)
        text = choice.detok.step(ids)
        if choice.stops is not None and armed:
            step = choice.stops.feed(text)
            if step.stopped:
                choice.finish_reason = "stop"
                self._open -= 1
                return TextDelta(index, step.emit, "stop", lp, tuple(ids) if self._spec.want_token_ids else ())
            text = step.emit
        if not text and not lp:
            if self._spec.want_token_ids and ids:
                return TextDelta(index, "", None, (), tuple(ids))
            return None
        return TextDelta(index, text, None, lp, tuple(ids) if self._spec.want_token_ids else ())

    def _finish(
        self,
        choice: _Choice,
        index: int,
        reason: str,
        text: str = "",
        lp: tuple[TokenLogprob, ...] = (),
    ) -> TextDelta:
        """End a choice: flush what the detokenizer and stop matcher held back."""
        tail = text + choice.detok.finish()
        if choice.stops is not None:
            step = choice.stops.feed(tail)
            tail = step.emit if step.stopped else step.emit + choice.stops.flush()
        choice.finish_reason = reason
        self._open -= 1
        return TextDelta(index, tail, reason, lp)
