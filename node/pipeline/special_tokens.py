"""Where a tokenizer's added tokens (``<|eot_id|>``, ``<｜User｜>``, ...) occur in a text, found exactly as
Hugging Face ``tokenizers`` finds them.

Hugging Face extracts added tokens before anything else runs, in two passes: first the tokens declared
``normalized=False`` over the raw text, then the ``normalized=True`` ones over the normalized gaps the
first pass left. Each pass is a leftmost-longest, non-overlapping scan (a longer token wins over a shorter
one starting at the same place, so ``<|a|><|b|>`` is never split into ``<|a|>`` + ``<|b|>``), and a scan
resumes right after each match, so the text before a match never influences what is found after it.

That last property is what makes a match end a safe cut: the text before it and the text after it are
tokenized as if they were separate texts. `AddedTokenMatcher.boundaries` returns those cuts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TypeAlias


@dataclass(frozen=True, slots=True)
class AddedToken:
    """One added token as tokenizer.json declares it."""

    content: str
    id: int
    special: bool
    normalized: bool  # matched after the normalizer ran (second pass) rather than on the raw text
    lstrip: bool = False
    rstrip: bool = False
    single_word: bool = False


_Trie: TypeAlias = dict[str, "_Trie"]  # "" marks the end of a word


def longest_match_pattern(words: Iterable[str]) -> str:
    """A regex matching the longest of ``words`` at a position: a trie whose every node tries its
    continuations before ending, so backtracking settles on the deepest word along the (unique) path."""
    root: _Trie = {}
    for word in words:
        node = root
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = {}

    def emit(node: _Trie) -> str:
        branches = [re.escape(ch) + emit(child) for ch, child in sorted(node.items()) if ch]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        return f"(?:{body})?" if "" in node else body

    return emit(root)


class AddedTokenMatcher:
    """Finds added-token occurrences with Hugging Face's two-pass, leftmost-longest semantics.

    ``second_pass`` is False when the tokenizer has a normalizer that changes text: the second pass then
    runs on text this class never sees, so only first-pass matches are reported (every one of them is
    still a true match, which is all `boundaries` promises). Exact only if `matching_problem` finds none.
    """

    __slots__ = ("_first", "_second", "ids", "tokens")

    def __init__(self, tokens: Sequence[AddedToken], *, second_pass: bool = True) -> None:
        self.tokens = tuple(tokens)
        self.ids: dict[str, int] = {t.content: t.id for t in tokens}  # the id of each matched text
        first = [t.content for t in tokens if not t.normalized and t.content]
        second = [t.content for t in tokens if t.normalized and t.content] if second_pass else []
        self._first = re.compile(longest_match_pattern(first)) if first else None
        self._second = re.compile(longest_match_pattern(second)) if second else None

    def spans(self, text: str) -> list[tuple[int, int]]:
        """(start, end) of every occurrence, in text order."""
        if self._first is None:
            found: list[tuple[int, int]] = []
        else:
            found = [m.span() for m in self._first.finditer(text)]
        if self._second is None:
            return found
        merged: list[tuple[int, int]] = []
        gap_start = 0
        for start, end in [*found, (len(text), len(text))]:
            # Second-pass tokens are looked for only in the gaps, each scanned on its own.
            merged.extend(m.span() for m in self._second.finditer(text, gap_start, start))
            if start != end:
                merged.append((start, end))
            gap_start = end
        return merged

    def boundaries(self, text: str) -> list[int]:
        """The end offsets of all occurrences: positions where ``text`` can be cut and each side
        tokenized on its own with the same result."""
        if self._second is None:
            return [] if self._first is None else [m.end() for m in self._first.finditer(text)]
        return [end for _, end in self.spans(text)]


def matching_problem(tokens: Sequence[AddedToken]) -> str | None:
    """Why `AddedTokenMatcher` could miss where Hugging Face places ``tokens``, or None.

    ``lstrip``/``rstrip`` make a match absorb neighbouring whitespace and ``single_word`` rejects matches
    inside words; this matcher implements neither.
    """
    for t in tokens:
        if not t.content:
            return "an added token is empty"
        if t.lstrip or t.rstrip or t.single_word:
            return f"added token {t.content!r} strips whitespace or must be a single word"
    return None


def single_pass_problem(tokens: Sequence[AddedToken]) -> str | None:
    """Why one leftmost scan over all ``tokens`` (tiktoken's special-token matching, in any alternation
    order) could find other occurrences than Hugging Face's two passes, or None.

    They agree when (a) no token is a prefix of another: at most one token matches at a position, so
    neither order nor length preference matters; and (b) no second-pass token can start before a
    first-pass token it overlaps (contain it, or end inside it): the first pass would claim the
    first-pass token, a single pass the earlier one.
    """
    problem = matching_problem(tokens)
    if problem is not None:
        return problem
    contents = {t.content for t in tokens}
    nested = sorted(contents & {c[:i] for c in contents for i in range(1, len(c))})
    if nested:
        return f"added token {nested[0]!r} is a prefix of another added token"
    first = [t.content for t in tokens if not t.normalized]
    second = [t.content for t in tokens if t.normalized]
    if first and second:
        first_prefixes = {c[:i] for c in first for i in range(1, len(c))}
        for b in second:
            if any(a in b for a in first) or any(b[i:] in first_prefixes for i in range(1, len(b))):
                return f"normalized added token {b!r} overlaps a non-normalized one"
    return None
