"""What a worker's Generate stream may say, checked message by message. Pure: outputs in, verdicts out.

A worker is trusted with nothing a client would notice. Per request (``ContractLimits``):

- a choice never gets more than ``max_tokens`` ids: the message that crosses the bound is cut to what is
  allowed, the choice finishes with ``length``, and the verdict says the worker stream must be aborted (an
  engine that streams past its bound, or sends 3M ids at once, is not relayed, whatever it does next);
- every id relayed is in ``[0, vocab_size)`` and every choice index in ``[0, n)``;
- ``cached_tokens`` never exceeds the prompt's length.

A broken rule other than the first raises ``WorkerProtocolError`` (a worker fault, counted against its
breaker). Overrunning ``max_tokens`` is repaired instead (the client still gets a correct answer) and reported
as ``Verdict.overrun`` so the caller can count it against the worker once the answer is out.

"New" ids follow the stream's framing, as ``node.pipeline.generate`` reads it: with ``stream`` a choice's
final message repeating its last chunk's ids (vLLM's DELTA output kind) adds nothing; without ``stream`` the
one final message carries every id.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from node.errors import WorkerProtocolError
from node.workers.types import TokenLogprobs, WorkerOutput

#: The finish reason of a choice the contract cut at ``max_tokens`` (what the engine itself would have said).
LENGTH = "length"
# Above every id a worker can send (ids are uint32 on the wire): the vocabulary bound when none is known.
_ANY_ID = 1 << 32


@dataclass(frozen=True, slots=True)
class ContractLimits:
    """The bounds of one request. ``vocab_size`` 0: unknown, ids are not range-checked."""

    max_tokens: int
    n: int
    prompt_tokens: int
    vocab_size: int
    stream: bool = True

    def __post_init__(self) -> None:
        if self.max_tokens < 0 or self.n < 1 or self.prompt_tokens < 0 or self.vocab_size < 0:
            raise ValueError(f"invalid contract limits: {self}")


@dataclass(frozen=True, slots=True)
class Verdict:
    """What to pass on for one worker message.

    ``outputs``: the messages to hand to the pipeline in place of the worker's (none when its choice had
    ended already; two, a chunk and its repeating final message, when a streamed choice was cut).
    ``abort_stream``: stop reading this worker stream and abort the request on the worker.
    ``overrun``: the worker sent more than ``max_tokens`` for a choice (a worker fault, repaired).
    """

    outputs: tuple[WorkerOutput, ...]
    abort_stream: bool = False
    overrun: bool = False


@dataclass(slots=True)
class _ChoiceState:
    ids: int = 0  # ids relayed so far
    last_chunk: Sequence[int] = ()
    finished: bool = False
    cut: bool = False  # finished by the contract, not by the worker


@dataclass(slots=True)
class WorkerContract:
    """Feed every ``WorkerOutput`` of one Generate stream to ``check``, in arrival order."""

    limits: ContractLimits
    url: str = "worker"
    _choices: list[_ChoiceState] = field(init=False)
    # The limits read per message, as plain attributes (``_vocab``: an upper bound that admits every id
    # when the vocabulary size is unknown).
    _max_tokens: int = field(init=False)
    _prompt_tokens: int = field(init=False)
    _vocab: int = field(init=False)

    def __post_init__(self) -> None:
        limits = self.limits
        self._choices = [_ChoiceState() for _ in range(limits.n)]
        self._max_tokens = limits.max_tokens
        self._prompt_tokens = limits.prompt_tokens
        self._vocab = limits.vocab_size or _ANY_ID

    @property
    def all_finished(self) -> bool:
        return all(c.finished for c in self._choices)

    def relayed(self, index: int) -> int:
        """Ids relayed so far for choice ``index`` (never more than ``max_tokens``)."""
        return self._choices[index].ids

    def passes_chunks(self, outs: Sequence[WorkerOutput]) -> bool:
        """``passes`` for a batch of streamed chunks (no finish among them), all or nothing: every message
        passes and is applied, or nothing changed."""
        if len(outs) == 1:
            out = outs[0]
            return out.finish_reason is None and self.passes(out)
        for out in outs:
            if out.finish_reason is not None:
                return False
        choices = self._choices
        undo: list[tuple[_ChoiceState, int, Sequence[int]]] = []
        for out in outs:
            choice = choices[out.index] if 0 <= out.index < len(choices) else None
            if choice is not None:
                undo.append((choice, choice.ids, choice.last_chunk))
            if choice is None or not self.passes(out):
                for choice, ids, last in reversed(undo):  # ``passes`` changes only these two
                    choice.ids, choice.last_chunk = ids, last
                return False
        return True

    def passes(self, out: WorkerOutput) -> bool:
        """The common case, cheaply (no verdict built): ``out`` breaks no rule and is relayed as it is; its
        choice's state advances as ``check`` would advance it. False: nothing changed, ask ``check``.

        Runs once per worker message: a streamed chunk of one id takes the shortest path (no calls)."""
        index = out.index
        choices = self._choices
        if not (0 <= index < len(choices) and 0 <= out.cached_tokens <= self._prompt_tokens):
            return False
        choice = choices[index]
        if choice.finished:
            return False
        ids = out.token_ids
        if out.finish_reason is None:
            new = len(ids)
            if new > self._max_tokens - choice.ids:
                return False
            if new == 1:
                if not 0 <= ids[0] < self._vocab:
                    return False
            elif new and not (min(ids) >= 0 and max(ids) < self._vocab):
                return False
            choice.ids += new
            # Kept as sent (a message is never changed once yielded); made a tuple only by the one final
            # message that compares against it.
            choice.last_chunk = ids
            return True
        new = 0 if self.limits.stream and tuple(ids) == tuple(choice.last_chunk) else len(ids)
        if new > self._max_tokens - choice.ids:
            return False
        if new and not (min(ids) >= 0 and max(ids) < self._vocab):
            return False
        choice.ids += new
        choice.finished = True
        return True

    def check(self, out: WorkerOutput) -> Verdict:
        """The verdict on one message. Raises WorkerProtocolError when the worker broke the contract."""
        limits = self.limits
        if not 0 <= out.index < limits.n:
            raise WorkerProtocolError(f"worker {self.url} sent choice index {out.index} of n={limits.n}")
        if not 0 <= out.cached_tokens <= limits.prompt_tokens:
            raise WorkerProtocolError(
                f"worker {self.url} reported {out.cached_tokens} cached tokens of a {limits.prompt_tokens}-token prompt"
            )
        choice = self._choices[out.index]
        if choice.finished:
            # After its final message (or our cut) a choice takes nothing more: the pipeline never sees it.
            return Verdict((), abort_stream=choice.cut)
        ids = out.token_ids
        repeat = limits.stream and out.finish_reason is not None and tuple(ids) == tuple(choice.last_chunk)
        new = 0 if repeat else len(ids)
        room = limits.max_tokens - choice.ids
        if new > room:
            return self._cut(out, choice, ids[:room])
        if new:
            self._check_ids(ids)
        choice.ids += new
        if out.finish_reason is None:
            choice.last_chunk = tuple(ids)
        else:
            choice.finished = True
        return Verdict((out,))

    def _cut(self, out: WorkerOutput, choice: _ChoiceState, allowed: Sequence[int]) -> Verdict:
        """The worker overran ``max_tokens`` with ``out``: relay ``allowed`` and finish the choice there."""
        self._check_ids(allowed)
        choice.ids += len(allowed)
        choice.finished = choice.cut = True
        kept = tuple(allowed)
        logprobs = _first_logprobs(out.logprobs, len(kept))
        final = out._replace(token_ids=kept, finish_reason=LENGTH, matched_token_id=None, logprobs=logprobs)
        if not self.limits.stream:
            return Verdict((final,), abort_stream=True, overrun=True)
        chunk = final._replace(finish_reason=None, kv_transfer_params_json=None)
        # A streamed choice ends as vLLM ends one: its last chunk, then a final message repeating it. A lone
        # final message could be read as a repeat of the previous chunk and dropped.
        outputs = (chunk, final) if kept else (final,)
        return Verdict(outputs, abort_stream=True, overrun=True)

    def _check_ids(self, ids: Sequence[int]) -> None:
        vocab = self.limits.vocab_size
        if vocab and ids and (min(ids) < 0 or max(ids) >= vocab):
            bad = next(t for t in ids if not 0 <= t < vocab)
            raise WorkerProtocolError(f"worker {self.url} sent token id {bad} outside the vocabulary [0, {vocab})")


def _first_logprobs(lp: TokenLogprobs | None, count: int) -> TokenLogprobs | None:
    if lp is None:
        return None
    return TokenLogprobs(
        token_ids=lp.token_ids[:count],
        logprobs=lp.logprobs[:count],
        top_ids=lp.top_ids[:count],
        top_logprobs=lp.top_logprobs[:count],
    )
