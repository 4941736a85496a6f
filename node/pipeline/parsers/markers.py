"""Finding markup markers in streamed text while holding back only a possible marker prefix.

The hot path is text with no markup at all: `MarkerSet.may_hold` answers "can this chunk contain or start a
marker?" with one C-level ``in`` test per distinct first character, so a plain chunk costs well under a
microsecond and is passed through whole.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable


class MarkerSet:
    """A fixed set of marker strings searched for in a buffer."""

    __slots__ = ("_firsts", "_longest_prefix", "_markers", "_prefixes")

    def resume_at(self, text: str) -> int:
        """Where the next `find` over ``text`` plus more appended text may start: no complete marker
        begins before it (one would lie wholly inside ``text`` and have been found already)."""
        return max(0, len(text) - self._longest_prefix)

    def __init__(self, markers: Iterable[str]) -> None:
        # Longest first, so among markers starting at the same place the longest wins.
        self._markers = tuple(sorted({m for m in markers if m}, key=len, reverse=True))
        self._prefixes = frozenset(m[:i] for m in self._markers for i in range(1, len(m)))
        self._firsts = tuple(sorted({m[0] for m in self._markers}))
        self._longest_prefix = max((len(m) - 1 for m in self._markers), default=0)

    def may_hold(self, text: str) -> bool:
        """False when ``text`` holds no character that starts a marker (then it has no marker and no
        marker prefix)."""
        # A plain loop: ~3x cheaper than any() over a generator on the hot path (short text, 1-2 firsts).
        for first in self._firsts:  # noqa: SIM110
            if first in text:
                return True
        return False

    def find(self, text: str, start: int = 0) -> tuple[int, str] | None:
        """The earliest complete marker at or after ``start``: ``(position, marker)``, or None."""
        best: tuple[int, str] | None = None
        for marker in self._markers:
            at = text.find(marker, start)
            if at >= 0 and (best is None or at < best[0]):
                best = (at, marker)
        return best

    def held_len(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of some marker: the part that
        must wait for the next chunk."""
        size = len(text)
        tail = text[size - self._longest_prefix :] if size > self._longest_prefix else text
        if not self.may_hold(tail):  # the common case inside a long call: no marker character near the end
            return 0
        for start in range(max(0, size - self._longest_prefix), size):
            if text[start] in self._firsts and text[start:] in self._prefixes:
                return size - start
        return 0


# Parsers are built per request from a model's few fixed markers: the sets are immutable, so one per marker
# tuple is shared (building one walks every prefix of every marker, ~3 µs a set, several sets a request).
_SHARED_SETS = 256


@functools.lru_cache(maxsize=_SHARED_SETS)
def marker_set(*markers: str) -> MarkerSet:
    """The shared `MarkerSet` of ``markers``."""
    return MarkerSet(markers)
