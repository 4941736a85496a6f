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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StopStep:
    emit: str  # text safe to send now
    stopped: bool = False  # a stop matched: the stream is over, later feeds emit nothing
    matched: str | None = None  # the stop string that matched


_NOTHING = StopStep("")


class StopMatcher:
    """Matches stop strings across chunk boundaries. One instance per generated sequence.

    Per feed the work is bounded by ``len(chunk) + longest stop``: a match ending in the new chunk can only
    start inside the held-back suffix (it would otherwise have made a longer suffix a stop prefix), so only
    the held suffix plus the chunk is ever searched.

    After a stop matched, `feed` returns an empty stopped step (chunks already in flight are harmless) and
    `flush` returns "". Empty stop strings are ignored.
    """

    __slots__ = ("_firsts", "_held", "_include", "_last_chars", "_longest", "_prefixes", "_stop", "_stops")

    def __init__(self, stops: Sequence[str], *, include_stop_str: bool) -> None:
        # Longest first, so a strict "ends earlier" comparison keeps the longest among equal ends.
        self._stops = tuple(sorted({s for s in stops if s}, key=len, reverse=True))
        self._include = include_stop_str
        self._held = ""
        self._stop: StopStep | None = None
        prefixes = {s[:i] for s in self._stops for i in range(1, len(s))}
        self._prefixes = frozenset(prefixes)
        self._firsts = frozenset(p[0] for p in prefixes)
        # A held suffix ends in the last character of some proper prefix: most chunks fail this O(1) test.
        self._last_chars = frozenset(p[-1] for p in prefixes)
        self._longest = max(map(len, prefixes), default=0)

    def feed(self, text: str) -> StopStep:
        """Add generated text; return what may be sent now and whether a stop matched."""
        if self._stop is not None:
            return StopStep("", True, self._stop.matched)
        if not self._stops:
            return StopStep(text)
        if not text:
            return _NOTHING
        pending = self._held + text
        best = ""
        best_end = len(pending) + 1
        for stop in self._stops:
            # `in` first: a bare operator is ~3x cheaper than a .find() call, and most chunks hold no stop.
            if stop in pending:
                end = pending.find(stop) + len(stop)
                if end < best_end:
                    best, best_end = stop, end
        if best:
            self._held = ""
            self._stop = StopStep(pending[:best_end] if self._include else pending[: best_end - len(best)], True, best)
            return self._stop
        keep = self._held_len(pending) if pending[-1] in self._last_chars else 0
        if not keep:
            self._held = ""
            return StopStep(pending)
        self._held = pending[-keep:]
        return StopStep(pending[:-keep]) if keep < len(pending) else _NOTHING

    def flush(self) -> str:
        """End of generation without a stop: return the held-back text."""
        held, self._held = self._held, ""
        return held

    def _held_len(self, pending: str) -> int:
        """Length of the longest suffix of `pending` that is a proper prefix of some stop."""
        firsts = self._firsts
        prefixes = self._prefixes
        for start in range(max(0, len(pending) - self._longest), len(pending)):
            if pending[start] in firsts and pending[start:] in prefixes:
                return len(pending) - start
        return 0
