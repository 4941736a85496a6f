"""The Output stage: worker messages in, typed events out, for the n choices of one generate spec. Pure
(no I/O, no clock): Dispatch feeds it what the worker sent and forwards the events it returns.

Per choice the chain is: detokenize → stop matching (EOS, stop_token_ids, stop strings; the gateway, not the
engine, decides where an answer ends) → text stages (reasoning, then tool calls: ``TextStage``; the output
parsers plug in as ``ParserStage``, none by default) → events. Usage counts only the tokens the client's
answer consumed, so it is exact even when the gateway cut the answer short.

Hot path: one ``ContentDelta`` per choice for the worker messages that arrived together (one write to the
client) at most; ids are stepped one at a time only when something needs to know which token produced which
text (stop strings, logprobs, token ids), else those messages' ids are detokenized at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from node.errors import WorkerAborted, WorkerProtocolError
from node.pipeline.continuation import room_to_continue
from node.pipeline.detokenize import IncrementalDetokenizer
from node.pipeline.events import ContentDelta, Event, Finish, TokenLogprob, Usage
from node.pipeline.parsing import KeepingDetokenizer, ThinkCounter
from node.pipeline.spec import GenerateSpec
from node.pipeline.stops import StopMatcher, StopSet
from node.pipeline.tokenizer import Tokenizer
from node.workers.types import TokenLogprobs, WorkerOutput

# Detokenizer context: the prompt's last ids, so the answer's first token decodes as it would in sequence.
PROMPT_CONTEXT_IDS = 8


class TextStage(Protocol):
    """One step of a choice's text chain after stop matching: the reasoning parser, then the tool-call
    parser (``node.pipeline.parser_stage.ParserStage``, through ``Stages``). Pure and chunk-boundary invariant.

    ``feed`` takes answer text, appends the events of its own kind (ReasoningDelta, ToolCallDelta) to
    ``events`` and returns the text it leaves to the next stage (content); ``finish`` flushes what it held
    back when the choice ends.
    """

    def feed(self, index: int, text: str, events: list[Event]) -> str: ...

    def finish(self, index: int, events: list[Event]) -> str: ...


class Detokenizer(Protocol):
    def step(self, ids: Sequence[int]) -> str: ...

    def finish(self) -> str: ...


#: The text stages of one choice, made per choice (stages keep state). None: no stages, the fast path.
Stages = Callable[[GenerateSpec], Sequence[TextStage]]


@dataclass(slots=True)
class _Choice:
    detok: Detokenizer
    stops: StopMatcher | None
    stages: Sequence[TextStage] = ()
    thinking: ThinkCounter | None = None  # counts reasoning tokens by id
    last_chunk: Sequence[int] = ()  # ids of the latest streamed chunk, as sent
    consumed: int = 0  # ids that count as completion tokens
    finished: bool = False
    over_budget: bool = False  # reached the reasoning budget inside the block: pauses or ends after this step
    paused: bool = False  # waits for the continue step (``OutputProcessor.resume``); reads nothing until then
    produced: list[int] | None = None  # every id consumed, kept only for a choice that may be continued


def _ended(choice: _Choice) -> bool:
    # A function, not an attribute test inline: mypy would narrow ``finished`` across the calls that set it.
    return choice.finished or choice.paused


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


class OutputProcessor:
    """The n choices of one spec. ``feed`` every batch of worker messages; read ``complete`` (every choice
    ended: stop reading), ``worker_done`` (the worker itself finished every choice: nothing to abort) and
    ``paused`` (the choice reached its reasoning budget inside the block: stop reading, abort that stream,
    ``resume()`` and continue on a new one: node/pipeline/continuation.py).

    Events number choices from ``index_offset`` (a batch request's k-th prompt starts at k * n).
    """

    # Slots: the per-token path reads a dozen of these attributes per worker message.
    __slots__ = (
        "_choices",
        "_close_ids",
        "_min_tokens",
        "_offset",
        "_open",
        "_per_token",
        "_spec",
        "_terminators",
        "_think_budget",
        "_want_ids",
        "_want_logprobs",
        "_worker_finished",
        "complete",
        "continued",
        "paused",
        "usage",
        "worker_streams",
    )

    def __init__(
        self, spec: GenerateSpec, tokenizer: Tokenizer, *, index_offset: int = 0, stages: Stages | None = None
    ) -> None:
        self._spec = spec
        self._offset = index_offset
        self.usage = Usage(prompt_tokens=len(spec.prompt_ids))
        n = spec.params.n
        stop_set = StopSet(spec.stops) if spec.stops else None  # built once, shared by the n choices' matchers
        plan = spec.parsing
        context = spec.prompt_ids[-PROMPT_CONTEXT_IDS:]
        # The parsers' special-token delimiters are decoded even when the client skips special tokens.
        keep = plan.keep_ids if plan is not None and spec.params.skip_special_tokens else frozenset()
        think_ids = plan.think_ids if plan is not None else None
        # The reasoning budget is enforced where reasoning tokens are counted (by id): not without think ids.
        self._think_budget = plan.think_budget if plan is not None and think_ids is not None else None
        # Ids that close the block when the budget runs out, so the choice answers on (one choice only: n
        # choices share one worker stream); empty: the budget ends the choice "length".
        close = plan.think_close_ids if plan is not None and self._think_budget is not None and n == 1 else ()
        self._close_ids: tuple[int, ...] = close

        def detokenizer() -> Detokenizer:
            if keep:
                return KeepingDetokenizer(tokenizer, keep, context)
            return IncrementalDetokenizer(
                tokenizer.raw, skip_special_tokens=spec.params.skip_special_tokens, prompt_ids=context
            )

        self._choices = [
            _Choice(
                detok=detokenizer(),
                stops=StopMatcher(stop_set, include_stop_str=spec.include_stop_str) if stop_set else None,
                stages=stages(spec) if stages is not None else (),
                thinking=ThinkCounter(think_ids, in_reasoning=plan.in_reasoning)
                if think_ids is not None and plan is not None
                else None,
                produced=[] if close else None,
            )
            for _ in range(n)
        ]
        # A choice waits for the continue step: read per worker message, like ``complete``.
        self.paused = False
        # The prompt's prefix-cache reads count for the first stream only: a continuation's prompt is the
        # client's prompt plus the answer so far, whose cache hits are not the client's input.
        self.continued = False
        self._open = n
        # Every choice ended: stop reading. An attribute (set where the last choice closes), not a property:
        # Dispatch reads it per worker message.
        self.complete = False
        self._worker_finished = 0  # choices the worker itself reported finished
        # Whether the worker is asked to stream: the client streams, or stop strings or a reasoning budget
        # need an early look (a budget is acted on when reached, not after the whole answer was generated).
        self.worker_streams = spec.client_stream or bool(spec.stops) or self._think_budget is not None
        # Per-token stepping is needed only to know exactly which token completed a stop string or to attach
        # logprobs/ids to the text they produced; otherwise whole chunks are detokenized at once.
        # A reasoning budget ends a choice at an exact token too, whatever the chunking.
        self._per_token = (
            bool(spec.stops)
            or spec.params.logprobs is not None
            or spec.want_token_ids
            or self._think_budget is not None
        )
        # Read per token: kept as plain attributes rather than looked up through the spec each time.
        self._min_tokens = spec.params.min_tokens
        self._terminators = spec.terminators
        self._want_ids = spec.want_token_ids
        self._want_logprobs = spec.params.logprobs is not None

    @property
    def worker_done(self) -> bool:
        return self._worker_finished == len(self._choices)

    def feed(self, outs: Sequence[WorkerOutput]) -> list[Event]:
        """Events for messages that arrived together (one write to the client). Raises WorkerProtocolError
        for a choice index past n, WorkerAborted when the worker aborted the request by itself."""
        events: list[Event] = []
        usage = self.usage
        n = len(self._choices)
        if len(outs) > 1 and not self._per_token:
            return self._feed_merged(outs, events)
        for out in outs:
            if out.index >= n:
                raise WorkerProtocolError(f"the worker sent choice index {out.index} of n={n}")
            # A continuation's prompt is the whole answer so far: its cached tokens are not the prompt's.
            if out.cached_tokens > usage.cached_tokens and not self.continued:
                usage.cached_tokens = out.cached_tokens
            self._consume(out, events)
        return events

    def _feed_merged(self, outs: Sequence[WorkerOutput], events: list[Event]) -> list[Event]:
        """``feed`` when nothing needs to know which token made which text: consecutive chunks of one choice
        that arrived together are stepped as one chunk (one detokenizer step, one ContentDelta), since they
        reach the client in the same write anyway. The text, its order, the stops and the counts are those of
        stepping them one by one (the detokenizer and text stages are chunk-boundary invariant); only the
        number of deltas differs, as with an engine that sends several tokens per message."""
        usage = self.usage
        n = len(self._choices)
        run_index = -1  # the choice whose chunks are being merged; -1: none
        run_ids: list[int] = []
        last: Sequence[int] = ()
        for out in outs:
            index = out.index
            if index >= n:
                raise WorkerProtocolError(f"the worker sent choice index {index} of n={n}")
            if out.cached_tokens > usage.cached_tokens and not self.continued:
                usage.cached_tokens = out.cached_tokens
            if out.finish_reason is None and out.logprobs is None:
                if index != run_index:
                    if run_index >= 0:
                        self._step_run(run_index, run_ids, last, events)
                    run_index, run_ids = index, []
                run_ids += out.token_ids
                last = out.token_ids
                continue
            if run_index >= 0:
                self._step_run(run_index, run_ids, last, events)
                run_index = -1
            self._consume(out, events)
        if run_index >= 0:
            self._step_run(run_index, run_ids, last, events)
        return events

    def _step_run(self, index: int, ids: list[int], last: Sequence[int], events: list[Event]) -> None:
        choice = self._choices[index]
        if _ended(choice):
            return
        # The last message's ids, as sent: what vLLM's final message repeats (``_consume``).
        choice.last_chunk = last
        self._step(choice, self._offset + index, ids, (), events)

    def _consume(self, out: WorkerOutput, events: list[Event]) -> None:
        choice = self._choices[out.index]
        reason = out.finish_reason
        ids = out.token_ids
        if reason is None:
            # A chunk: the common case, once per worker message.
            if _ended(choice):
                return
            choice.last_chunk = ids  # kept as sent: a message is never changed once yielded
            if self._per_token:
                self._step_each(choice, self._offset + out.index, ids, out.logprobs, events)
            else:
                self._step(choice, self._offset + out.index, ids, (), events)
            return
        self._worker_finished += 1
        if _ended(choice):
            return
        index = self._offset + out.index
        # vLLM's servicer ends each streamed choice with a chunk and then a final message repeating that
        # chunk's ids (its output kind is DELTA): they are not new.
        if not (self.worker_streams and tuple(ids) == tuple(choice.last_chunk)):
            if self._per_token:
                self._step_each(choice, index, ids, out.logprobs, events)
            else:
                self._step(choice, index, ids, (), events)
        if not _ended(choice):
            if reason == "abort":
                raise WorkerAborted("the worker aborted the request")
            self._finish(choice, index, "length" if reason == "length" else "stop", events)

    def _step_each(
        self, choice: _Choice, index: int, ids: Sequence[int], lp: TokenLogprobs | None, events: list[Event]
    ) -> None:
        """Feed ids one at a time (stop strings, logprobs, token ids or a reasoning budget need to know which
        token made which text), each with its logprob entry."""
        logprobs = _logprob_entries(lp, 0, len(ids)) if self._want_logprobs else []
        for k, token in enumerate(ids):
            self._step(choice, index, (token,), (logprobs[k],) if k < len(logprobs) else (), events)
            if _ended(choice):
                break

    def _step(
        self, choice: _Choice, index: int, ids: Sequence[int], lp: tuple[TokenLogprob, ...], events: list[Event]
    ) -> None:
        """Feed ids (one, when per-token) to a choice; append the events they make."""
        # As in vLLM's stop checker, nothing ends an answer before min_tokens (the engine masks EOS and
        # stop_token_ids until then; stop strings are not matched until then either).
        armed = choice.consumed + len(ids) > self._min_tokens
        terminators = self._terminators
        # A set test in C first: the generator costs per token. The first terminator at or past min_tokens
        # ends the answer (position k makes consumed + k + 1 tokens), wherever the chunk boundaries fall.
        if armed and not terminators.isdisjoint(ids):
            floor = self._min_tokens - choice.consumed
            cut = next((k for k, t in enumerate(ids) if t in terminators and k >= floor), -1)
        else:
            cut = -1
        if cut >= 0:
            # The terminator counts as generated (as engines count EOS) but is not part of the text.
            choice.consumed += cut + 1
            if choice.thinking is not None:
                self._think(choice, ids[:cut])
            self.usage.completion_tokens += cut + 1
            text = choice.detok.step(ids[:cut]) if cut else ""
            self._finish(choice, index, "stop", events, text=text, lp=lp)
            return
        choice.consumed += len(ids)
        self.usage.completion_tokens += len(ids)
        if choice.produced is not None:
            choice.produced.extend(ids)
        if choice.thinking is not None:
            self._think(choice, ids)
        text = choice.detok.step(ids)
        if choice.stops is not None and armed:
            step = choice.stops.feed(text)
            if step.stopped:
                self._emit(choice, index, step.emit, events, lp=lp, token_ids=self._ids_of(ids))
                self._close(choice, index, "stop", events, stop=step.matched)
                return
            text = step.emit
        # The common case inline (no text stages): one ContentDelta or nothing; _emit otherwise.
        stages = choice.stages
        if stages:
            # _emit inlined: this runs per worker message for every request with a parser.
            for stage in stages:
                text = stage.feed(index, text, events)
            if text or lp or (self._want_ids and ids):
                events.append(ContentDelta(index, text, lp, tuple(ids) if self._want_ids else ()))
        elif text or lp:
            events.append(ContentDelta(index, text, lp, tuple(ids) if self._want_ids else ()))
        elif self._want_ids and ids:
            events.append(ContentDelta(index, "", (), tuple(ids)))
        if choice.over_budget:
            choice.over_budget = False
            max_tokens = self._spec.params.max_tokens
            if self._close_ids and room_to_continue(max_tokens, choice.consumed, len(self._close_ids)):
                choice.paused = self.paused = True
            else:
                self._finish(choice, index, "length", events)

    def resume(self) -> tuple[list[Event], tuple[int, ...]]:
        """The continue step's Output side, for the paused choice: its reasoning block closed with the
        family's ids, fed through its chain as if the model had written them (they count as output tokens),
        and the state kept per worker stream reset. Returns the events that makes and every id the choice
        has produced, the close ids last: what the continuation prompt appends. The choice may end here (a
        stop string in the close): read ``complete``."""
        choice = self._choices[0]
        if not choice.paused or choice.produced is None:
            raise RuntimeError("resume() without a paused choice")
        choice.paused = self.paused = False
        self.continued = True
        choice.last_chunk = ()  # the next stream's chunks are new, whatever their ids
        self._worker_finished = 0
        events: list[Event] = []
        for token in self._close_ids:
            self._step(choice, self._offset, [token], (), events)
            if choice.finished:
                break
        return events, tuple(choice.produced)

    def _think(self, choice: _Choice, ids: Sequence[int]) -> None:
        thinking = choice.thinking
        if thinking is not None:
            before = thinking.count
            thinking.feed(ids)
            self.usage.reasoning_tokens += thinking.count - before
            budget = self._think_budget
            if budget is not None and thinking.count >= budget and not thinking.done:
                choice.over_budget = True
            if thinking.done:
                choice.thinking = None  # past the block: nothing more to count

    def _ids_of(self, ids: Sequence[int]) -> tuple[int, ...]:
        return tuple(ids) if self._want_ids else ()

    def _emit(
        self,
        choice: _Choice,
        index: int,
        text: str,
        events: list[Event],
        *,
        lp: tuple[TokenLogprob, ...] = (),
        token_ids: tuple[int, ...] = (),
    ) -> None:
        """Answer text (after stops) through the text stages into a content delta, if there is anything."""
        for stage in choice.stages:
            text = stage.feed(index, text, events)
        if text or lp or token_ids:
            events.append(ContentDelta(index, text, lp, token_ids))

    def _finish(
        self,
        choice: _Choice,
        index: int,
        reason: str,
        events: list[Event],
        *,
        text: str = "",
        lp: tuple[TokenLogprob, ...] = (),
    ) -> None:
        """End a choice: flush what the detokenizer and stop matcher held back."""
        tail = text + choice.detok.finish()
        stop = None
        if choice.stops is not None:
            step = choice.stops.feed(tail)
            tail = step.emit if step.stopped else step.emit + choice.stops.flush()
            stop = step.matched
        self._emit(choice, index, tail, events, lp=lp)
        self._close(choice, index, reason, events, stop=stop)

    def _close(self, choice: _Choice, index: int, reason: str, events: list[Event], *, stop: str | None = None) -> None:
        for k, stage in enumerate(choice.stages):
            rest = stage.finish(index, events)
            for later in choice.stages[k + 1 :]:
                rest = later.feed(index, rest, events)
            if rest:
                events.append(ContentDelta(index, rest))
        choice.finished = True
        self._open -= 1
        self.complete = self._open == 0
        events.append(Finish(index, reason, stop))
