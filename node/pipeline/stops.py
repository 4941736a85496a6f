"""Stop-string matching over a stream of text deltas (sans-IO).

Which match wins: the occurrence that *ends* earliest in the stream; among stops ending at the same place,
the longest (it starts earliest, so the least text is emitted). Choosing by earliest end is what lets the
stop be reported at the very chunk that completes it: picking the earliest *start* would mean waiting to see
whether a longer stop that began earlier (``"abcdef"`` around ``"cd"``) completes too. The two rules differ
only when one stop string occurs strictly inside another.

Invariants, for any split of a text into `feed` calls:

1. The concatenated emits (plus `flush()` if no stop matched) equal ``text[:start]`` — or
   ``text[:start] + stop`` with `include_stop_str` — where ``start`` is where the winning match begins, and
   equal ``text`` if no stop occurs.
2. `stopped` is True exactly from the feed whose text completes the match.
3. Before that, each emit holds back exactly the longest suffix of the text so far that is a proper prefix of
   some stop string, so no part of a stop ever leaks, and nothing else is delayed.

Memory is linear in the total length of the stop strings: one `StopSet` (the strings and a KMP failure table
per string) is built per request and shared by its n choices; each choice's `StopMatcher` adds only the held
text and one integer per stop string.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StopStep:
    emit: str  # text safe to send now
    stopped: bool = False  # a stop matched: the stream is over, later feeds emit nothing
    matched: str | None = None  # the stop string that matched


_NOTHING = StopStep("")


def _failure(stop: str) -> array[int]:
    """KMP failure table: ``f[i]`` = length of the longest proper prefix of ``stop[:i + 1]`` that is also its
    suffix. 4 bytes per character."""
    fail = array("i", bytes(4 * len(stop)))
    k = 0
    for i in range(1, len(stop)):
        c = stop[i]
        while k and stop[k] != c:
            k = fail[k - 1]
        if stop[k] == c:
            k += 1
        fail[i] = k
    return fail


class StopSet:
    """The immutable, shareable half of stop matching: the stop strings (empty ones dropped, duplicates
    merged, longest first) and their KMP failure tables. Built once per request in O(total length)."""

    __slots__ = ("failures", "last_chars", "stops")

    def __init__(self, stops: Sequence[str]) -> None:
        # Longest first, so a strict "ends earlier" comparison keeps the longest among equal ends.
        self.stops: tuple[str, ...] = tuple(sorted({s for s in stops if s}, key=len, reverse=True))
        self.failures: tuple[array[int], ...] = tuple(_failure(s) for s in self.stops)
        # The last characters of every proper prefix: a text whose last character is not among them holds
        # nothing back, which most chunks show by one O(1) test.
        self.last_chars: frozenset[str] = frozenset(c for s in self.stops for c in s[:-1])

    def __bool__(self) -> bool:
        return bool(self.stops)


class StopMatcher:
    """Matches stop strings across chunk boundaries. One instance per generated sequence.

    Per feed the work is O(stops x (len(chunk) + longest stop)) at C speed (a substring search of the held
    suffix plus the chunk: a match ending in the new chunk can only start inside the held-back suffix), plus,
    only when the chunk's last character could end a stop prefix, one KMP step per stop and chunk character.

    After a stop matched, `feed` returns an empty stopped step (chunks already in flight are harmless) and
    `flush` returns "". Empty stop strings are ignored.
    """

    __slots__ = ("_held", "_include", "_last_chars", "_set", "_state", "_stop", "_stops")

    def __init__(self, stops: StopSet | Sequence[str], *, include_stop_str: bool) -> None:
        self._set = stops if isinstance(stops, StopSet) else StopSet(stops)
        self._stops = self._set.stops  # (copied out of the set: one attribute lookup less per feed)
        self._last_chars = self._set.last_chars
        self._include = include_stop_str
        self._held = ""
        self._stop: StopStep | None = None
        # Per stop: the length of the longest suffix of the text so far that is a proper prefix of it.
        self._state = [0] * len(self._set.stops)

    def feed(self, text: str) -> StopStep:
        """Add generated text; return what may be sent now and whether a stop matched."""
        if self._stop is not None:
            return StopStep("", True, self._stop.matched)
        stops = self._stops
        if not stops:
            return StopStep(text)
        if not text:
            return _NOTHING
        pending = self._held + text
        best = ""
        best_end = len(pending) + 1
        for stop in stops:
            # `in` first: a bare operator is ~3x cheaper than a .find() call, and most chunks hold no stop.
            if stop in pending:
                end = pending.find(stop) + len(stop)
                if end < best_end:
                    best, best_end = stop, end
        if best:
            self._held = ""
            self._stop = StopStep(pending[:best_end] if self._include else pending[: best_end - len(best)], True, best)
            return self._stop
        if pending[-1] in self._last_chars:
            keep = self._advance(text)
        else:
            # No stop prefix ends in this character, so no suffix is one; the states were all 0 already
            # unless something was held.
            keep = 0
            if self._held:
                self._state = [0] * len(stops)
        if not keep:
            self._held = ""
            return StopStep(pending)
        self._held = pending[-keep:]
        return StopStep(pending[:-keep]) if keep < len(pending) else _NOTHING

    def flush(self) -> str:
        """End of generation without a stop: return the held-back text."""
        held, self._held = self._held, ""
        return held

    def _advance(self, text: str) -> int:
        """Step every stop's KMP state over ``text``; return the longest held-back suffix length.

        No stop occurs in held + text (feed checked), so no state reaches its stop's full length."""
        state = self._state
        keep = 0
        for i, (stop, fail) in enumerate(zip(self._stops, self._set.failures, strict=True)):
            k = state[i]
            for c in text:
                while k and stop[k] != c:
                    k = fail[k - 1]
                if stop[k] == c:
                    k += 1
            state[i] = k
            keep = max(keep, k)
        return keep
