"""The answer a simulated sequence writes: deterministic token ids, finish reasons as vLLM decides them.

Pure: no clock, no I/O, randomness from a ``random.Random`` seeded by the request itself. The same prompt ids,
request seed, sampling knobs, output index and engine seed always give the same tokens; without a request
seed the prompt ids alone pick the answer. ``max_tokens`` only cuts the answer, so a shorter limit gives a
prefix of a longer one.

Stop rules follow vLLM v1 (`check_stop`): the length cap is checked first, no stop token ends a sequence
before ``min_tokens`` tokens, the model's primary EOS ends it with no matched id, and a request stop id (or
one of the model's other EOS ids) ends it with that id as ``matched_token_id``.

Length: each answer is ``eos_after_tokens`` text tokens on average (drawn from [mean/2, 3*mean/2]) and at
least ``min_tokens``, then ends with the first request stop id when the request names some, else with the
primary EOS unless ``ignore_eos``.

A ``Script`` replaces the prose answer with segments: fixed ids (a tool call in the family's markup, a
constrained answer, ``</think>``) and prose runs (reasoning, a plain answer); the end token follows the last
segment. ``min_tokens`` does not lengthen a script: padding would break the shape it was written to have.
"""

from __future__ import annotations

import hashlib
import random
import struct
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from node.sim.vocabulary import TextVocabulary
from node.structured.constraint import Constraint

FinishReason = Literal["stop", "length", "abort"]

# Odds of a comma / full stop after a word: often enough to look like prose.
COMMA_PROBABILITY = 0.07
PERIOD_PROBABILITY = 0.06
# Odds of a function word ("the", "of") after a content word or comma, and after another function word.
FUNCTION_WORD_PROBABILITY = 0.3
FUNCTION_WORD_AFTER_FUNCTION = 0.1
# Redraws of a text token that would be a stop token masked by min_tokens; the vocabulary has thousands of
# words and a request names a handful of stop ids, so 16 redraws all hitting one is not a real case.
MAX_MASKED_REDRAWS = 16
_LENGTH_SALT = 0x5EED_1E57
# Kinds of the previous text token.
_START, _CONTENT, _FUNCTION, _COMMA, _PERIOD = range(5)


@dataclass(frozen=True, slots=True)
class Finish:
    """Why a sequence ended; ``matched_token_id`` names the stop id that ended it, as vLLM reports it."""

    reason: FinishReason
    matched_token_id: int | None = None


@dataclass(frozen=True, slots=True)
class SamplingSpec:
    """The sampling parameters the engine acts on."""

    max_tokens: int | None = None
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    seed: int | None = None
    n: int = 1
    knobs: tuple[float, ...] = ()
    """Temperature, top-p and the like: the engine has no model for them, but they change the answer."""
    constraint: Constraint | None = None
    """The structured output the answer must satisfy (node.sim.answers writes it)."""


@dataclass(frozen=True, slots=True)
class Prose:
    """A run of readable text tokens; ``length`` None: the answer's drawn length."""

    length: int | None = None


Segment = tuple[int, ...] | Prose
Script = tuple[Segment, ...]


@dataclass(frozen=True, slots=True)
class EosPolicy:
    """The model's end-of-sequence ids: the one the engine emits and every one that ends a sequence."""

    primary: int | None
    all_ids: tuple[int, ...] = ()


def answer_seed(prompt_ids: Sequence[int], sampling: SamplingSpec, index: int, engine_seed: int) -> int:
    """A 64-bit seed for one output index of one request."""
    digest = hashlib.blake2b(digest_size=8)
    digest.update(struct.pack("<qqq", engine_seed, index, -1 if sampling.seed is None else 0))
    if sampling.seed is not None:
        digest.update(struct.pack("<q", sampling.seed))
    digest.update(struct.pack(f"<{len(sampling.knobs)}d", *sampling.knobs))
    digest.update(array("I", prompt_ids).tobytes())
    return int.from_bytes(digest.digest(), "little")


def answer_length(mean: int, rng: random.Random) -> int:
    """Text tokens before the end token: uniform in [mean/2, 3*mean/2], 0 only when ``mean`` is 0."""
    if mean <= 0:
        return 0
    return max(1, round(mean * (0.5 + rng.random())))


class TokenStream:
    """One sequence's answer, produced a few tokens at a time."""

    def __init__(
        self,
        *,
        vocabulary: TextVocabulary,
        eos: EosPolicy,
        sampling: SamplingSpec,
        prompt_ids: Sequence[int],
        index: int,
        engine_seed: int,
        eos_after_tokens: int,
        max_tokens: int,
        script: Script | None = None,
    ) -> None:
        """``max_tokens`` is the effective cap (the request's, clamped to the context window), at least 1;
        ``script`` (None: one prose run) is what the answer says before its end token."""
        seed = answer_seed(prompt_ids, sampling, index, engine_seed)
        self._rng = random.Random(seed)
        self._vocabulary = vocabulary
        self._max_tokens = max(1, max_tokens)
        self._min_tokens = sampling.min_tokens
        self._primary_eos = None if sampling.ignore_eos else eos.primary
        other_eos = () if sampling.ignore_eos else tuple(i for i in eos.all_ids if i != eos.primary)
        self._stop_ids = frozenset((*sampling.stop_token_ids, *other_eos))
        if sampling.stop_token_ids:
            self._end_token: int | None = sampling.stop_token_ids[0]
        else:
            self._end_token = self._primary_eos
        drawn = answer_length(eos_after_tokens, random.Random(seed ^ _LENGTH_SALT))
        self._text_length = max(self._min_tokens, drawn)
        self._generated = 0
        self._previous_kind = _START
        self._finish: Finish | None = None
        self._tokens = self._generate(script if script is not None else (Prose(),))

    @property
    def generated(self) -> int:
        return self._generated

    @property
    def finish(self) -> Finish | None:
        return self._finish

    def take(self, count: int) -> tuple[list[int], Finish | None]:
        """Up to ``count`` more tokens, and the finish once the sequence has ended (then no more tokens)."""
        tokens: list[int] = []
        while len(tokens) < count and self._finish is None:
            token = self._next_token()
            tokens.append(token)
            self._generated += 1
            self._finish = self._check_stop(token)
        return tokens, self._finish

    def _check_stop(self, token: int) -> Finish | None:
        if self._generated >= self._max_tokens:
            return Finish("length")
        if self._generated < self._min_tokens:
            return None
        if token == self._primary_eos:
            return Finish("stop")
        if token in self._stop_ids:
            return Finish("stop", token)
        return None

    def _next_token(self) -> int:
        return next(self._tokens)

    def _generate(self, script: Script) -> Iterator[int]:
        """Every token of the answer, in order; endless (prose) once the end token is out or absent."""
        if self._end_token is not None:
            for segment in script:
                if isinstance(segment, Prose):
                    length = self._text_length if segment.length is None else segment.length
                    self._previous_kind = _START
                    for k in range(length):
                        yield self._prose_token(length - k)
                else:
                    yield from segment
            yield self._end_token
        while True:  # ignore_eos, or past the end token: prose until the length cap
            yield self._prose_token(-1)

    def _prose_token(self, to_end: int) -> int:
        token = self._text_token(to_end)
        # A stop token cannot be sampled before min_tokens (vLLM masks its logit): draw again.
        redraws = 0
        while self._generated < self._min_tokens and self._is_stop(token) and redraws < MAX_MASKED_REDRAWS:
            token = self._text_token(to_end)
            redraws += 1
        return token

    def _is_stop(self, token: int) -> bool:
        return token == self._primary_eos or token in self._stop_ids

    def _text_token(self, to_end: int) -> int:
        """A word or punctuation token; the previous token's kind shapes the next, so the text reads.
        ``to_end``: tokens left in this prose run (-1: open-ended), so it closes with a word and a full stop."""
        vocabulary = self._vocabulary
        # Both draws happen on every call so the stream stays aligned whatever branch is taken.
        roll = self._rng.random()
        pick = self._rng.random()
        previous = self._previous_kind
        # The answer closes with a content word and a full stop just before the end token.
        if to_end == 1 and previous == _CONTENT and vocabulary.period is not None:
            return self._emit(_PERIOD, vocabulary.period)
        if to_end == 2 and previous != _START:
            return self._emit(_CONTENT, _choose(vocabulary.words, pick))
        if previous in (_START, _PERIOD) and vocabulary.capitalized:
            return self._emit(_CONTENT, _choose(vocabulary.capitalized, pick))
        if previous == _CONTENT:
            if roll < COMMA_PROBABILITY and vocabulary.comma is not None:
                return self._emit(_COMMA, vocabulary.comma)
            roll -= COMMA_PROBABILITY
            if roll < PERIOD_PROBABILITY and vocabulary.period is not None:
                return self._emit(_PERIOD, vocabulary.period)
            roll -= PERIOD_PROBABILITY
        function_odds = FUNCTION_WORD_AFTER_FUNCTION if previous == _FUNCTION else FUNCTION_WORD_PROBABILITY
        if roll < function_odds and vocabulary.function_words:
            return self._emit(_FUNCTION, _choose(vocabulary.function_words, pick))
        return self._emit(_CONTENT, _choose(vocabulary.words, pick))

    def _emit(self, kind: int, token: int) -> int:
        self._previous_kind = kind
        return token


def _choose(ids: tuple[int, ...], fraction: float) -> int:
    return ids[min(len(ids) - 1, int(fraction * len(ids)))]
