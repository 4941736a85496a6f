"""Delta dissemination bookkeeping (pure): what to piggyback, what was already seen, what must wait.

* Every delta we write or apply for the first time is queued and piggybacked on gossip
  ``retransmit_mult * ceil(log10(n + 1))`` times, fewest-sent and newest first (memberlist's
  transmit-limited queue), so deltas spread as an epidemic: receivers relay, not only the writer.
* Row documents are *superseded*, not logged: the queue holds one entry per (document, writer) — the
  clock range ``[start, end)`` of that writer's updates not yet fully gossiped — and encodes it when a
  packet has room, from our replica, from clock 0 if that fits (``ClusterState._encode_range``).
  Overwritten values are garbage in Yrs by then, so the entry costs about one value however many
  writes it covers: when writes outpace gossip, intermediate versions are skipped instead of queueing
  (rows are "latest value" data), and a receiver that missed an earlier delta has no hole. A range
  carries the writer's items only, no delete set (see ``Replica.structs_since``: a relay's delete set
  would delete other writers' values it does not replace — measured: rows vanishing for a gossip
  round). Registry updates and pure deletions are queued verbatim (each operation matters).
* Duplicates are dropped by a digest of the bytes before any decoding (gossip repeats them verbatim).
* Yrs integrates one writer's updates in clock order. A delta whose ``start`` is past the writer's clock
  we hold is *held* (bounded) until the missing part arrives, instead of parking it inside Yrs, whose
  pending buffer is unbounded and slow to merge. A hole that never fills (a delta lost for good) is
  filled by the next push-pull, which also releases what was held.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from mesh.broadcast import retransmit_limit
from mesh.limits import MAX_COMPOUND_PARTS
from mesh.state.wire import Delta

#: Entries looked at per packet before giving up on filling the rest of it.
_MAX_SCAN = 64

#: Encodes the range entry (doc, writer, start) from our replica; None if it cannot be sent (too big for
#: a packet, or obsolete) and should be dropped.
RangeEncoder = Callable[[str, int, int], bytes | None]


def digest(raw: bytes) -> bytes:
    return hashlib.blake2b(raw, digest_size=16).digest()


@dataclass(slots=True, eq=False)
class _Entry:
    doc: str
    client: int
    start: int
    payload: bytes | None  # verbatim (raw entries) or the cached encoding of the range
    ranged: bool
    transmits: int = 0


_Key = tuple[str, int] | bytes


class DeltaQueue:
    """Transmit-limited queue in tiers by send count (``tiers[k]``: entries sent ``k`` times, oldest
    first), so serving a packet never sorts the backlog."""

    __slots__ = ("_entries", "_tiers", "dropped", "retransmit_mult")

    def __init__(self, retransmit_mult: int) -> None:
        self.retransmit_mult = retransmit_mult
        self._tiers: list[OrderedDict[_Key, None]] = [OrderedDict()]
        self._entries: dict[_Key, _Entry] = {}
        #: Entries pruned before their last transmit (gossip could not keep up).
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._entries)

    def offer_raw(self, raw: bytes, doc: str) -> None:
        key = digest(raw)
        if key not in self._entries:
            self._entries[key] = _Entry(doc, 0, 0, raw, ranged=False)
            self._tiers[0][key] = None

    def offer_range(self, doc: str, client: int, start: int) -> None:
        """New content of ``client`` in ``doc`` from clock ``start``: (re)start its transmit count and
        widen the queued range, if any, to cover it."""
        key = (doc, client)
        entry = self._entries.get(key)
        if entry is None:
            self._entries[key] = _Entry(doc, client, start, None, ranged=True)
        else:
            self._tiers[entry.transmits].pop(key, None)
            entry.start = min(entry.start, start)
            entry.payload = None
            entry.transmits = 0
        self._tiers[0][key] = None

    def get(self, overhead: int, limit: int, n: int, encode: RangeEncoder) -> list[bytes]:
        """Payloads for one packet: within ``limit`` bytes with ``overhead`` each, for a cluster of
        ``n``; each entry is dropped after its last transmit."""
        if not self._entries or limit <= overhead:
            return []
        max_transmits = retransmit_limit(self.retransmit_mult, n)
        while len(self._tiers) <= max_transmits:
            self._tiers.append(OrderedDict())
        out: list[bytes] = []
        taken: list[_Key] = []
        used = scanned = 0
        for tier in self._tiers:
            for key in reversed(tier):
                scanned += 1
                entry = self._entries[key]
                if entry.payload is None:
                    entry.payload = encode(entry.doc, entry.client, entry.start)
                    if entry.payload is None:
                        taken.append(key)  # dropped below: nothing to send
                        continue
                size = overhead + len(entry.payload)
                if used + size <= limit:
                    used += size
                    out.append(entry.payload)
                    taken.append(key)
                if len(out) >= MAX_COMPOUND_PARTS or scanned >= _MAX_SCAN or limit - used <= overhead:
                    break
            else:
                continue
            break
        for key in taken:
            entry = self._entries[key]
            self._tiers[entry.transmits].pop(key, None)
            if entry.payload is None:
                del self._entries[key]
                continue
            entry.transmits += 1
            if entry.transmits >= max_transmits:
                del self._entries[key]
            else:
                self._tiers[entry.transmits][key] = None
        return out

    def drop_doc(self, doc: str) -> None:
        for key in [k for k, e in self._entries.items() if e.doc == doc]:
            entry = self._entries.pop(key)
            self._tiers[entry.transmits].pop(key, None)

    def prune(self, keep: int) -> None:
        """Drop the most-sent, oldest entries until ``keep`` remain."""
        for tier in reversed(self._tiers):
            while len(self._entries) > keep and tier:
                key, _ = tier.popitem(last=False)
                del self._entries[key]
                self.dropped += 1


class DeltaGossip:
    """Not thread-safe: owned by one ClusterState."""

    __slots__ = ("_held", "_max_held", "_max_queued", "_max_seen", "_queue", "_seen")

    def __init__(self, retransmit_mult: int, *, max_seen: int, max_held: int, max_queued: int) -> None:
        self._queue = DeltaQueue(retransmit_mult)
        self._seen: OrderedDict[bytes, None] = OrderedDict()
        self._held: OrderedDict[tuple[str, int, int], tuple[Delta, bytes]] = OrderedDict()
        self._max_seen = max_seen
        self._max_held = max_held
        self._max_queued = max_queued

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def held(self) -> int:
        return len(self._held)

    @property
    def dropped(self) -> int:
        return self._queue.dropped

    def seen(self, raw: bytes) -> bool:
        """Whether these exact bytes were seen recently; remembers them if not."""
        key = digest(raw)
        if key in self._seen:
            self._seen.move_to_end(key)
            return True
        self._seen[key] = None
        if len(self._seen) > self._max_seen:
            self._seen.popitem(last=False)
        return False

    def offer_raw(self, raw: bytes, doc: str) -> None:
        """Queue an encoded delta verbatim."""
        self._queue.offer_raw(raw, doc)
        self._bound()

    def offer_range(self, doc: str, client: int, start: int) -> None:
        """Queue (or widen) the superseding entry of ``client``'s updates in ``doc`` from ``start``."""
        self._queue.offer_range(doc, client, start)
        self._bound()

    def _bound(self) -> None:
        # Past the bound gossip cannot keep up with the write rate: the most-sent entries go first;
        # receivers that miss one hold that writer's later deltas until a push-pull fills the hole.
        if len(self._queue) > self._max_queued:
            self._queue.prune(self._max_queued * 3 // 4)

    def take(self, overhead: int, limit: int, cluster_size: int, encode: RangeEncoder) -> list[bytes]:
        out = self._queue.get(overhead, limit, cluster_size, encode)
        for raw in out:  # our own (re-)encodings must not come back to us as news
            self.seen(raw)
        return out

    def hold(self, delta: Delta, raw: bytes) -> None:
        self._held[(delta.doc, delta.client, delta.start)] = (delta, raw)
        while len(self._held) > self._max_held:
            self._held.popitem(last=False)

    def release(self, doc: str, client: int, clock: int) -> list[tuple[Delta, bytes]]:
        """Held deltas of ``client`` in ``doc`` that can now be applied (``start <= clock``), in clock
        order; those wholly below ``clock`` are dropped as duplicates."""
        ready = []
        for key, (delta, raw) in list(self._held.items()):
            if key[0] != doc or key[1] != client or delta.start > clock:
                continue
            del self._held[key]
            if delta.end > clock or delta.end == delta.start:
                ready.append((delta, raw))
        ready.sort(key=lambda item: item[0].start)
        return ready

    def held_writers(self, doc: str) -> set[int]:
        return {client for (name, client, _) in self._held if name == doc}

    def drop_doc(self, doc: str) -> None:
        """Forget everything queued or held for a document that changed generation (its clocks and
        updates mean nothing in the new one)."""
        self._queue.drop_doc(doc)
        for key in [k for k in self._held if k[0] == doc]:
            del self._held[key]
