"""The token ids the simulated engine writes with, chosen once from the tokenizer's vocabulary.

Answers are drawn from tokens that decode to a space and a short ASCII word, a few function words ("the",
"of", ...), and the comma and full-stop tokens, so a demo decodes to something that reads like text. BPE
vocabularies are full of word fragments (" integr", " prosec"), so a candidate is dropped when a longer
word token continues it with anything but an inflection ("integr" + "ation"). Lower ids are the earlier
merges, which are the more frequent words, so the lists keep the lowest ids.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from tokenizers import Tokenizer

# How many words each list keeps: enough variety for a demo, cheap to pick from.
MAX_WORDS = 4096
MAX_CAPITALIZED_WORDS = 512
FUNCTION_WORDS = (
    "the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "with", "on", "was", "by", "this",
)  # fmt: skip
# Endings that make a longer word from a whole word ("decision" + "s"); any other ending of length 2 or more
# marks the shorter token as a fragment.
_INFLECTIONS = frozenset({"s", "es", "ed", "d", "ing", "er", "ers", "ly", "y", "r", "n", "st", "est", "ies"})
_MIN_FRAGMENT_TAIL = 2

# Letters in a word token (after its leading space).
MIN_WORD_LETTERS = 3
MAX_WORD_LETTERS = 10


@dataclass(frozen=True, slots=True)
class TextVocabulary:
    """Ids of word and punctuation tokens; only ``words`` must be non-empty."""

    words: tuple[int, ...]
    function_words: tuple[int, ...]
    capitalized: tuple[int, ...]
    comma: int | None
    period: int | None

    def __post_init__(self) -> None:
        if not self.words:
            raise ValueError("a text vocabulary needs at least one word token")


def vocabulary_from_pieces(pieces: Sequence[str]) -> TextVocabulary:
    """Pick the writing tokens from ``pieces``, the decoded text of every token id in id order.

    Raises:
        ValueError: no token decodes to a space and a lowercase word.
    """
    function_pieces = {" " + word: rank for rank, word in enumerate(FUNCTION_WORDS)}
    function_ids: dict[int, int] = {}
    comma: int | None = None
    period: int | None = None
    # One cheap pass sorts the vocabulary into lowercase and capitalised " word" tokens (regexes over a
    # 128k vocabulary cost most of a second).
    lower: list[tuple[int, str]] = []
    capital: list[tuple[int, str]] = []
    for token_id, piece in enumerate(pieces):
        if len(piece) > 1 and piece[0] == " " and piece.isascii() and piece[1:].isalpha():
            if piece[1:].islower():
                lower.append((token_id, piece))
            elif piece[1].isupper() and (len(piece) == 2 or piece[2:].islower()):
                capital.append((token_id, piece))
            continue
        if piece == "," and comma is None:
            comma = token_id
        elif piece == "." and period is None:
            period = token_id
    for token_id, piece in lower:
        rank = function_pieces.get(piece)
        if rank is not None and rank not in function_ids:
            function_ids[rank] = token_id
    return TextVocabulary(
        words=_whole_words(lower, MIN_WORD_LETTERS, MAX_WORD_LETTERS, MAX_WORDS, frozenset(function_pieces)),
        function_words=tuple(function_ids[rank] for rank in sorted(function_ids)),
        capitalized=_whole_words(capital, MIN_WORD_LETTERS, MAX_WORD_LETTERS, MAX_CAPITALIZED_WORDS),
        comma=comma,
        period=period,
    )


def vocabulary_from_tokenizer(tokenizer: Tokenizer) -> TextVocabulary:
    """Decode every id once (a fraction of a second for a 128k vocabulary) and pick the writing tokens.

    Raises:
        ValueError: the tokenizer has no word tokens.
    """
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    pieces = tokenizer.decode_batch([[i] for i in range(size)], skip_special_tokens=True)
    return vocabulary_from_pieces([p if isinstance(p, str) else "" for p in pieces])


def _whole_words(
    words: list[tuple[int, str]],
    min_letters: int,
    max_letters: int,
    limit: int,
    exclude: frozenset[str] = frozenset(),
) -> tuple[int, ...]:
    """The first ``limit`` ids of words with the right length that no longer word continues as a fragment."""
    known = sorted(piece for _, piece in words)
    chosen: list[int] = []
    for token_id, piece in words:
        if len(chosen) >= limit:
            break
        letters = len(piece) - 1
        if min_letters <= letters <= max_letters and piece not in exclude and not _is_fragment(piece, known):
            chosen.append(token_id)
    return tuple(chosen)


def _is_fragment(piece: str, known: list[str]) -> bool:
    position = bisect.bisect_right(known, piece)
    while position < len(known) and known[position].startswith(piece):
        tail = known[position][len(piece) :]
        if len(tail) >= _MIN_FRAGMENT_TAIL and tail not in _INFLECTIONS:
            return True
        position += 1
    return False
