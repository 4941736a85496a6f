"""Transmit-limited broadcast queue (memberlist's queue.go): what gossip and piggybacking carry.

Each update is sent ``retransmit_mult * ceil(log10(n + 1))`` times, which is enough for an epidemic to
reach every member with high probability, then dropped. Fresher updates go first: items are taken in
order of fewest transmits, newest first. A newer update about a member (same ``name``) replaces the older
one at once, so a member's alive/suspect/dead history never competes for space with itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from mesh.limits import MAX_BROADCAST_QUEUE


def retransmit_limit(retransmit_mult: int, n: int) -> int:
    """How many times each broadcast is sent in a cluster of ``n`` members."""
    return retransmit_mult * math.ceil(math.log10(n + 1))


@dataclass(slots=True, eq=False)
class _Item:
    name: str | None
    payload: bytes
    serial: int
    on_done: Callable[[], None] | None
    transmits: int = 0


class BroadcastQueue:
    """Not thread-safe: owned by one core."""

    __slots__ = ("_by_name", "_items", "_serial", "retransmit_mult")

    def __init__(self, retransmit_mult: int) -> None:
        self.retransmit_mult = retransmit_mult
        self._items: list[_Item] = []
        self._by_name: dict[str, _Item] = {}
        self._serial = 0

    def __len__(self) -> int:
        return len(self._items)

    def queue(self, payload: bytes, *, name: str | None = None, on_done: Callable[[], None] | None = None) -> None:
        """Enqueue an encoded message. ``name`` invalidates a queued message of the same name;
        ``on_done`` runs once the message is no longer broadcast (sent enough, replaced or pruned)."""
        if name is not None:
            old = self._by_name.pop(name, None)
            if old is not None:
                self._items.remove(old)
                _finish(old)
        self._serial += 1
        item = _Item(name, payload, self._serial, on_done)
        self._items.append(item)
        if name is not None:
            self._by_name[name] = item
        if len(self._items) > MAX_BROADCAST_QUEUE:
            self.prune(MAX_BROADCAST_QUEUE)

    def get(self, overhead: int, limit: int, n: int, max_count: int) -> list[bytes]:
        """At most ``max_count`` messages fitting in ``limit`` bytes, each costing ``overhead`` extra, for
        a cluster of ``n`` members."""
        if not self._items or limit <= overhead or max_count <= 0:
            return []
        max_transmits = retransmit_limit(self.retransmit_mult, n)
        self._items.sort(key=_order)
        out: list[bytes] = []
        used = 0
        done: list[_Item] = []
        for item in self._items:
            size = overhead + len(item.payload)
            if used + size > limit:
                if limit - used <= overhead:
                    break
                continue
            used += size
            out.append(item.payload)
            item.transmits += 1
            if item.transmits >= max_transmits:
                done.append(item)
            if len(out) >= max_count:
                break
        for item in done:
            self._drop(item)
        return out

    def prune(self, max_retain: int) -> None:
        """Keep only the ``max_retain`` freshest messages."""
        if len(self._items) <= max_retain:
            return
        self._items.sort(key=_order)
        for item in self._items[max_retain:]:
            if item.name is not None:
                self._by_name.pop(item.name, None)
            _finish(item)
        del self._items[max_retain:]

    def _drop(self, item: _Item) -> None:
        self._items.remove(item)
        if item.name is not None and self._by_name.get(item.name) is item:
            del self._by_name[item.name]
        _finish(item)


def _order(item: _Item) -> tuple[int, int]:
    return (item.transmits, -item.serial)


def _finish(item: _Item) -> None:
    if item.on_done is not None:
        callback, item.on_done = item.on_done, None
        callback()
