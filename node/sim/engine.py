"""The simulated engine: the asyncio shell that runs sequences over the pure cores.

Each sequence waits for a running slot (FIFO, ``max_running_requests``), leases its prompt's prefix from the
prefix cache, then writes its answer chunk by chunk, sleeping until each chunk is due under the latency
model. Sleeps are futures woken by a timer or by Abort, so an abort ends a stream at once. With zero latency
every chunk still yields to the loop once. Tasks exist only for n > 1 (one per output index); the request's
output iterator owns, cancels and awaits them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass

from node.routing.kv_events import KvEvent
from node.sim.admission import AdmissionQueue
from node.sim.answers import FamilyAnswers
from node.sim.config import SimWorkerConfig
from node.sim.errors import EngineClosedError, InvalidRequestError
from node.sim.kv_events import KvBatch, KvEventLog
from node.sim.latency import LatencyModel
from node.sim.model_folder import ModelFolder
from node.sim.prefix_cache import CacheBusyError, Lease, PrefixCache
from node.sim.token_generator import EosPolicy, Finish, SamplingSpec, Script, TokenStream, answer_seed
from node.sim.vocabulary import TextVocabulary

# n beyond this is a client mistake, not a load test: each index is a task and a running slot.
MAX_SAMPLES_PER_REQUEST = 128
# Abort request ids remembered for tests and diagnostics.
ABORT_LOG_SIZE = 1024


@dataclass(frozen=True, slots=True)
class GenerateSpec:
    request_id: str
    prompt_ids: tuple[int, ...]
    sampling: SamplingSpec
    kv_transfer_params: Mapping[str, object] | None = None


@dataclass(frozen=True, slots=True)
class SequenceOutput:
    """New tokens of one output index since its previous output, with the counts vLLM reports."""

    index: int
    token_ids: tuple[int, ...]
    output_tokens: int
    prompt_tokens: int
    cached_tokens: int
    finish: Finish | None = None
    kv_transfer_params: Mapping[str, object] | None = None


@dataclass(frozen=True, slots=True)
class LoadSnapshot:
    running_requests: int
    waiting_requests: int
    waiting_uncached_tokens: int
    used_tokens: int
    capacity_tokens: int
    token_usage: float
    cache_hit_rate: float
    max_running_requests: int


@dataclass(frozen=True, slots=True)
class ServerSnapshot:
    active_requests: int
    uptime_s: float
    last_receive_timestamp: float


class _Request:
    __slots__ = ("aborted", "prompt_hashes", "sequences", "spec")

    def __init__(self, spec: GenerateSpec) -> None:
        self.spec = spec
        self.aborted = False
        self.sequences: list[_Sequence] = []
        # The prompt's block hashes, computed once: GetLoads asks about every waiting prompt, each time.
        self.prompt_hashes: list[int] | None = None


class _Sequence:
    __slots__ = ("admitted", "index", "key", "lease", "output_ids", "request", "wake")

    def __init__(self, key: int, request: _Request, index: int) -> None:
        self.key = key
        self.request = request
        self.index = index
        self.lease: Lease | None = None
        self.output_ids: list[int] = []
        self.wake: asyncio.Future[None] | None = None
        self.admitted: asyncio.Future[bool] | None = None

    def interrupt(self) -> None:
        if self.wake is not None and not self.wake.done():
            self.wake.set_result(None)
        if self.admitted is not None and not self.admitted.done():
            self.admitted.set_result(False)


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class SimEngine:
    def __init__(
        self,
        config: SimWorkerConfig,
        model: ModelFolder,
        vocabulary: TextVocabulary,
        *,
        endpoint: tuple[str, int] = ("", 0),
        wall_clock: Callable[[], float] = time.time,
        answers: FamilyAnswers | None = None,
    ) -> None:
        """``answers`` scripts constrained, tool-calling and reasoning answers; None: prose only."""
        self._config = config
        self._answers = answers
        self._model = model
        self._vocabulary = vocabulary
        self._endpoint = endpoint
        self._wall_clock = wall_clock
        self._latency = LatencyModel.from_config(config)
        self._eos = EosPolicy(model.primary_eos_token_id, model.stop_eos_token_ids)
        self._cache = PrefixCache(config.block_size, config.cache_capacity_blocks)
        self._admission: AdmissionQueue[int] = AdmissionQueue(config.max_running_requests)
        self._kv_log = KvEventLog()
        self._kv_waiter: asyncio.Future[None] | None = None
        self._requests: dict[str, _Request] = {}
        self._sequences: dict[int, _Sequence] = {}
        self._keys = itertools.count(1)
        self._anonymous_ids = itertools.count(1)
        self._idle = asyncio.Event()
        self._idle.set()
        self._closed = False
        self._started_at = wall_clock()
        self._last_receive = 0.0
        self._abort_log: deque[str] = deque(maxlen=ABORT_LOG_SIZE)
        self._prompt_tokens_admitted = 0
        self._cached_tokens_admitted = 0
        self.completed_requests = 0
        self.cancelled_requests = 0
        #: kv_transfer_params of the requests handed a remote prefill (decode role), in arrival order.
        self.remote_prefills: list[Mapping[str, object]] = []

    # ----- what tests and the servicer read -----

    @property
    def config(self) -> SimWorkerConfig:
        return self._config

    @property
    def model(self) -> ModelFolder:
        return self._model

    @property
    def engine_id(self) -> str:
        host, port = self._endpoint
        return f"sim-{host}:{port}"

    @property
    def active_requests(self) -> int:
        return len(self._requests)

    @property
    def active_request_ids(self) -> tuple[str, ...]:
        return tuple(self._requests)

    @property
    def aborted_request_ids(self) -> tuple[str, ...]:
        """Ids named by Abort calls, oldest first (the last ``ABORT_LOG_SIZE``), known or not."""
        return tuple(self._abort_log)

    @property
    def closed(self) -> bool:
        return self._closed

    def server_snapshot(self) -> ServerSnapshot:
        return ServerSnapshot(
            active_requests=len(self._requests),
            uptime_s=max(0.0, self._wall_clock() - self._started_at),
            last_receive_timestamp=self._last_receive,
        )

    def load_snapshot(self) -> LoadSnapshot:
        size = self._cache.block_size
        used_blocks = self._cache.pinned_blocks
        waiting_uncached = 0
        for seq in self._sequences.values():
            prompt = seq.request.spec.prompt_ids
            if seq.lease is not None:
                total = len(prompt) + len(seq.output_ids)
                used_blocks += max(0, math.ceil(total / size) - len(seq.lease.pinned))
            elif not self._admission.is_running(seq.key):
                waiting_uncached += len(prompt) - self._cache.cached_prefix_tokens(prompt, self._hashes(seq.request))
        capacity_tokens = self._cache.capacity_blocks * size
        used_tokens = used_blocks * size
        return LoadSnapshot(
            running_requests=self._admission.running,
            waiting_requests=self._admission.waiting,
            waiting_uncached_tokens=waiting_uncached,
            used_tokens=used_tokens,
            capacity_tokens=capacity_tokens,
            token_usage=min(1.0, used_tokens / capacity_tokens) if capacity_tokens else 0.0,
            cache_hit_rate=(
                self._cached_tokens_admitted / self._prompt_tokens_admitted if self._prompt_tokens_admitted else 0.0
            ),
            max_running_requests=self._admission.max_running,
        )

    # ----- requests -----

    def submit(self, spec: GenerateSpec) -> AsyncGenerator[SequenceOutput, None]:
        """Validate and register a request; iterate the result (inside ``aclosing``) to run it.

        Outputs of different indices interleave; each index ends with an output carrying its finish.

        Raises:
            EngineClosedError: the engine is shutting down.
            InvalidRequestError: the prompt is empty, too long or out of vocabulary, the sampling parameters
                contradict each other, or the request id is already running.
        """
        if self._closed:
            raise EngineClosedError("the engine is shutting down")
        self._validate(spec)
        request_id = spec.request_id or f"sim-anonymous-{next(self._anonymous_ids)}"
        if request_id in self._requests:
            raise InvalidRequestError(f"request id {request_id!r} is already running")
        self._last_receive = self._wall_clock()
        return self._outputs(request_id, spec)

    def abort(self, request_ids: Sequence[str]) -> None:
        """End the named requests: each open index emits a last output with finish reason "abort"."""
        for request_id in request_ids:
            self._abort_log.append(request_id)
            request = self._requests.get(request_id)
            if request is None:
                continue
            request.aborted = True
            for seq in request.sequences:
                seq.interrupt()

    async def flush_cache(self, timeout_s: float) -> tuple[bool, str]:
        """Clear the prefix cache once no request runs, waiting up to ``timeout_s`` (0: fail if busy)."""
        if self._requests:
            if timeout_s <= 0:
                return False, "requests are in flight; pass a timeout to wait for them"
            try:
                await asyncio.wait_for(self._idle.wait(), timeout_s)
            except TimeoutError:
                return False, f"requests still in flight after {timeout_s} s"
        try:
            events = self._cache.clear()
        except CacheBusyError as exc:
            return False, str(exc)
        self._publish(events)
        return True, "Cache flushed successfully"

    async def kv_batches(self, start_sequence_number: int) -> AsyncGenerator[KvBatch, None]:
        """Batches after ``start_sequence_number`` (see ``KvEventLog.resume``), then live ones until close."""
        loop = asyncio.get_running_loop()
        batches = self._kv_log.resume(start_sequence_number, self._cache.live_blocks(), self._wall_clock())
        cursor = self._kv_log.last_sequence
        while True:
            for batch in batches:
                yield batch
            if self._closed:
                return
            if self._kv_waiter is None:
                self._kv_waiter = loop.create_future()
            waiter = self._kv_waiter
            missed = self._kv_log.read_after(cursor)
            if missed is None:
                # The subscriber fell behind the bounded history: resynchronise it with a snapshot.
                batches = self._kv_log.resume(cursor, self._cache.live_blocks(), self._wall_clock())
            elif missed:
                batches = missed
            else:
                # Shielded: a cancelled subscriber must not cancel the future the others share.
                await asyncio.shield(waiter)
                batches = []
                continue
            cursor = self._kv_log.last_sequence

    def close(self) -> None:
        """Take no new requests, abort the running ones and end the KV event subscriptions."""
        self._closed = True
        self.abort(list(self._requests))
        if self._kv_waiter is not None:
            _wake(self._kv_waiter)
            self._kv_waiter = None

    # ----- internals -----

    def _validate(self, spec: GenerateSpec) -> None:
        prompt = spec.prompt_ids
        model = self._model
        if not prompt:
            raise InvalidRequestError("the prompt must not be empty")
        if len(prompt) > model.max_context_length:
            raise InvalidRequestError(
                f"the prompt is {len(prompt)} tokens long, more than the model's maximum context length "
                f"{model.max_context_length}"
            )
        highest = max(prompt)
        if highest >= model.vocab_size:
            raise InvalidRequestError(f"token id {highest} is out of vocabulary (size {model.vocab_size})")
        sampling = spec.sampling
        if sampling.max_tokens is not None and sampling.max_tokens < 1:
            raise InvalidRequestError(f"max_tokens must be at least 1, got {sampling.max_tokens}")
        if sampling.max_tokens is not None and sampling.min_tokens > sampling.max_tokens:
            raise InvalidRequestError(
                f"min_tokens ({sampling.min_tokens}) must be at most max_tokens ({sampling.max_tokens})"
            )
        if not 1 <= sampling.n <= MAX_SAMPLES_PER_REQUEST:
            raise InvalidRequestError(f"n must be in [1, {MAX_SAMPLES_PER_REQUEST}], got {sampling.n}")

    async def _outputs(self, request_id: str, spec: GenerateSpec) -> AsyncGenerator[SequenceOutput, None]:
        # Registered on the first iteration, not in submit: an iterator closed before it started never runs
        # its body, so nothing would ever unregister it.
        if request_id in self._requests:
            raise InvalidRequestError(f"request id {request_id!r} is already running")
        request = _Request(spec)
        for index in range(spec.sampling.n):
            seq = _Sequence(next(self._keys), request, index)
            request.sequences.append(seq)
            self._sequences[seq.key] = seq
        self._requests[request_id] = request
        self._idle.clear()
        finished = False
        try:
            if len(request.sequences) == 1:
                async with contextlib.aclosing(self._run_sequence(request.sequences[0])) as outputs:
                    async for output in outputs:
                        yield output
            else:
                async with contextlib.aclosing(self._merge(request.sequences)) as outputs:
                    async for output in outputs:
                        yield output
            finished = True
        finally:
            # A sequence whose task was cancelled before it ever ran has not retired itself.
            for seq in request.sequences:
                self._retire(seq)
            del self._requests[request_id]
            if finished:
                self.completed_requests += 1
            else:
                self.cancelled_requests += 1
            if not self._requests:
                self._idle.set()

    async def _merge(self, sequences: list[_Sequence]) -> AsyncGenerator[SequenceOutput, None]:
        queue: asyncio.Queue[SequenceOutput | BaseException | None] = asyncio.Queue()

        async def pump(seq: _Sequence) -> None:
            try:
                async with contextlib.aclosing(self._run_sequence(seq)) as outputs:
                    async for output in outputs:
                        queue.put_nowait(output)
            except Exception as exc:
                queue.put_nowait(exc)
            finally:
                queue.put_nowait(None)

        tasks = [asyncio.create_task(pump(seq)) for seq in sequences]
        try:
            open_sequences = len(tasks)
            while open_sequences:
                item = await queue.get()
                if item is None:
                    open_sequences -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield item
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _run_sequence(self, seq: _Sequence) -> AsyncGenerator[SequenceOutput, None]:
        request = seq.request
        spec = request.spec
        prompt = spec.prompt_ids
        loop = asyncio.get_running_loop()
        try:
            if not await self._admit(seq, loop):
                yield SequenceOutput(seq.index, (), 0, len(prompt), 0, Finish("abort"))
                return
            admission = self._cache.admit(prompt, self._hashes(request))
            seq.lease = admission.lease
            self._publish(admission.events)
            cached = admission.cached_tokens
            self._prompt_tokens_admitted += len(prompt)
            self._cached_tokens_admitted += cached
            remote = self._remote_prefill(spec)
            if remote and spec.kv_transfer_params is not None:
                self.remote_prefills.append(spec.kv_transfer_params)
            uncached = 0 if remote else len(prompt) - cached
            room = max(1, self._model.max_context_length - len(prompt))
            max_tokens = room if spec.sampling.max_tokens is None else min(room, spec.sampling.max_tokens)
            stream = TokenStream(
                script=self._script(spec, seq.index),
                vocabulary=self._vocabulary,
                eos=self._eos,
                sampling=spec.sampling,
                prompt_ids=prompt,
                index=seq.index,
                engine_seed=self._config.seed,
                eos_after_tokens=self._config.eos_after_tokens,
                max_tokens=max_tokens,
            )
            deadline = loop.time()
            first = True
            while True:
                tokens, finish = stream.take(self._config.tokens_per_chunk)
                deadline += self._latency.chunk_s(
                    first=first, tokens=len(tokens), uncached_tokens=uncached, running=self._admission.running
                )
                await self._sleep_until(seq, deadline, loop)
                if request.aborted:
                    yield SequenceOutput(seq.index, (), len(seq.output_ids), len(prompt), cached, Finish("abort"))
                    return
                first = False
                seq.output_ids.extend(tokens)
                params = self._kv_transfer_params(spec) if finish is not None else None
                yield SequenceOutput(seq.index, tuple(tokens), len(seq.output_ids), len(prompt), cached, finish, params)
                if finish is not None:
                    return
        finally:
            self._retire(seq)

    def _script(self, spec: GenerateSpec, index: int) -> Script | None:
        if self._answers is None:
            return None
        seed = answer_seed(spec.prompt_ids, spec.sampling, index, self._config.seed)
        try:
            return self._answers.script(
                spec.prompt_ids,
                spec.sampling.constraint,
                seed,
                mean_length=self._config.eos_after_tokens,
                word_ids=self._vocabulary.words,
            )
        except (ValueError, RecursionError):  # checked at the wire; what still fails to sample gets prose
            return None

    async def _admit(self, seq: _Sequence, loop: asyncio.AbstractEventLoop) -> bool:
        if seq.request.aborted:
            return False
        if self._admission.submit(seq.key):
            return True
        seq.admitted = loop.create_future()
        return await seq.admitted

    async def _sleep_until(self, seq: _Sequence, deadline: float, loop: asyncio.AbstractEventLoop) -> None:
        if seq.request.aborted or deadline <= loop.time():
            await asyncio.sleep(0)
            return
        wake: asyncio.Future[None] = loop.create_future()
        timer = loop.call_at(deadline, _wake, wake)
        seq.wake = wake
        try:
            await wake
        finally:
            timer.cancel()
            seq.wake = None

    def _hashes(self, request: _Request) -> list[int]:
        if request.prompt_hashes is None:
            request.prompt_hashes = self._cache.block_hashes(request.spec.prompt_ids)
        return request.prompt_hashes

    def _retire(self, seq: _Sequence) -> None:
        """Cache the sequence's finished blocks, unpin its lease and hand its slot to the next in line.

        Idempotent: the request's own cleanup retires whatever its sequences did not.
        """
        if seq.key not in self._sequences:
            return
        if seq.lease is not None:
            if self._cache.enabled:  # else the whole prompt and answer would be copied to store nothing
                self._publish(self._cache.extend(seq.lease, (*seq.request.spec.prompt_ids, *seq.output_ids)))
            self._cache.release(seq.lease)
            seq.lease = None
        del self._sequences[seq.key]
        for key in self._admission.release(seq.key):
            waiting = self._sequences.get(key)
            if waiting is not None and waiting.admitted is not None and not waiting.admitted.done():
                waiting.admitted.set_result(True)

    def _publish(self, events: Sequence[KvEvent]) -> None:
        if self._kv_log.append(events, self._wall_clock()) is not None and self._kv_waiter is not None:
            _wake(self._kv_waiter)
            self._kv_waiter = None

    def _remote_prefill(self, spec: GenerateSpec) -> bool:
        """A decode worker handed a prefill's KV pays no prefill per token (the KV arrives by transfer)."""
        params = spec.kv_transfer_params
        return self._config.role == "decode" and params is not None and params.get("do_remote_prefill") is True

    def _kv_transfer_params(self, spec: GenerateSpec) -> Mapping[str, object] | None:
        """What a prefill worker hands the decode worker: itself and the request (NIXL-style keys)."""
        if self._config.role != "prefill":
            return None
        host, port = self._endpoint
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": self.engine_id,
            "remote_host": host,
            "remote_port": port,
            "remote_request_id": spec.request_id,
            "remote_prompt_tokens": len(spec.prompt_ids),
        }
