"""A consistent-hash ring with virtual nodes: keys map to workers so that a worker joining or leaving moves
only the keys on its own arcs (about 1/N of them).

Positions are 64-bit BLAKE2b digests, not Python's ``hash()`` (salted per process for str/bytes), so every
gateway node in a mesh maps a key to the same worker and their cache affinity agrees.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator


def ring_hash(data: bytes) -> int:
    """An unsigned 64-bit position on the ring."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


class HashRing:
    def __init__(self, virtual_nodes: int, urls: Iterable[str] = ()) -> None:
        if virtual_nodes < 1:
            raise ValueError("virtual_nodes must be >= 1")
        self._virtual_nodes = virtual_nodes
        self._urls: frozenset[str] = frozenset()
        self._points: list[int] = []
        self._owners: list[str] = []
        self.rebuild(urls)

    @property
    def urls(self) -> frozenset[str]:
        return self._urls

    def rebuild(self, urls: Iterable[str]) -> None:
        """Place exactly ``urls``; a worker's positions depend only on its URL, never on the others."""
        self._urls = frozenset(urls)
        placed = sorted(
            (ring_hash(f"{url}#{i}".encode()), url) for url in self._urls for i in range(self._virtual_nodes)
        )
        self._points = [point for point, _ in placed]
        self._owners = [url for _, url in placed]

    def owners(self, key_hash: int) -> Iterator[str]:
        """Distinct workers clockwise from ``key_hash``: the owner first, then each successor once."""
        count = len(self._points)
        if count == 0:
            return
        start = bisect_right(self._points, key_hash)
        seen: set[str] = set()
        for i in range(count):
            url = self._owners[(start + i) % count]
            if url not in seen:
                seen.add(url)
                yield url
                if len(seen) == len(self._urls):
                    return

    def find(self, key_hash: int, accept: Callable[[str], bool]) -> str | None:
        """The first worker clockwise from ``key_hash`` that ``accept`` takes, or None."""
        return next((url for url in self.owners(key_hash) if accept(url)), None)
