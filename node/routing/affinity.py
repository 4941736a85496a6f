"""Cache-affinity hints: what other nodes' routing decisions say about which worker holds which prefix.

cache_aware's approximate tree only knows what *this* node sent. In a mesh, the follow-up turn of a
conversation often arrives at another node; without help that node sends it anywhere and the worker that
holds the conversation's prefix is missed. So every routing decision for a worker that publishes no KV
events is summarised as a few *hints* — (prefix hash of the first k pages, k, worker URL) for k the prompt's
last full page and every power of two below it — and spread by best-effort gossip. The last page catches the
next turn of the same conversation (its prompt extends this one); the powers of two catch a shared system
prompt. Hints already known (same prefix, same worker, fresher than half the TTL) are not sent again.

A receiving node keeps hints in a bounded map (LRU by insertion, aged out after ``ttl_s``) and, when routing,
looks the prompt's page hashes up from the deepest: the deepest hint per worker says how many leading tokens
that worker was sent. Hints are lossy and soft: a lost one costs one cache miss, never correctness.

Prefix hashes are ``block_hashes``' (Python's deterministic tuple hash); a message carries a check value so a
node whose hash differs (another Python build) ignores hints it could not match anyway.

Wire (version 1): ``>BHq`` version, page size, hash check; ``B`` URL count, each ``B`` length + UTF-8; then
entries ``>qIB`` prefix hash, pages, URL index, to the end. Version 2 is a version-1 message as seen some time
ago (``aged``): ``>BI`` version, age in ms, then the version-1 message. Only the join snapshot of recent hints
(node/cluster/hint_snapshot.py) sends it: its hints are dated back by the age, so they expire when they would have
where they were made, and never replace a fresher hint of the same prefix.
"""

from __future__ import annotations

import struct
import time
from collections import OrderedDict
from collections.abc import Callable

from node.routing.block_hashes import BlockHashes

HINT_VERSION = 1
AGED_HINT_VERSION = 2
HASH_CHECK = hash((1, 2, 3))
_HEADER = struct.Struct(">BHq")
_ENTRY = struct.Struct(">qIB")
_AGED = struct.Struct(">BI")
#: Ages past ~49 days saturate (no hint lives that long).
MAX_AGE_MS = 0xFFFF_FFFF
MAX_URL_BYTES = 255
MAX_URLS_PER_MESSAGE = 255


def aged(msg: bytes, age_s: float) -> bytes:
    """A version-1 hint message as it was ``age_s`` seconds ago (version 2, see the module docstring)."""
    return _AGED.pack(AGED_HINT_VERSION, min(MAX_AGE_MS, max(0, round(age_s * 1000)))) + msg


def hint_depths(pages: int) -> list[int]:
    """The page counts a prompt of ``pages`` full pages is hinted at: powers of two, and ``pages``."""
    depths = []
    k = 1
    while k < pages:
        depths.append(k)
        k *= 2
    if pages > 0:
        depths.append(pages)
    return depths


class AffinityHints:
    """Not thread-safe: used on the event loop by the routing policy and the mesh channel."""

    def __init__(
        self,
        page_size: int,
        *,
        ttl_s: float,
        max_entries: int,
        max_message_bytes: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if page_size < 1 or page_size > 0xFFFF:
            raise ValueError("page_size must be in 1..65535")
        self._page = page_size
        self._ttl = ttl_s
        self._max = max_entries
        self._max_bytes = max_message_bytes
        self._clock = clock
        self._map: OrderedDict[int, tuple[str, int, float]] = OrderedDict()  # prefix -> (url, pages, at)
        self._outbox: dict[int, tuple[str, int]] = {}
        self.sent = 0
        self.received = 0
        self.rejected = 0

    @property
    def page_size(self) -> int:
        return self._page

    def __len__(self) -> int:
        return len(self._map)

    def learn(self, hashes: BlockHashes, url: str) -> None:
        """This node sent the prompt of ``hashes`` to ``url``: queue its hints."""
        pages = hashes.resized(self._page)
        full = pages.full_blocks
        if full == 0 or len(url.encode()) > MAX_URL_BYTES:
            return
        now = self._clock()
        path = pages.upto(full)
        for depth in hint_depths(full):
            prefix = path[depth - 1]
            known = self._map.get(prefix)
            if known is not None and known[0] == url and now - known[2] < self._ttl / 2:
                continue
            self._put(prefix, url, depth, now)
            self._outbox[prefix] = (url, depth)

    def match(self, hashes: BlockHashes) -> dict[str, int]:
        """Leading prompt tokens each hinted worker was sent (the deepest fresh hint per worker)."""
        if not self._map:
            return {}
        pages = hashes.resized(self._page)
        found: dict[str, int] = {}
        oldest = self._clock() - self._ttl
        entries = self._map
        path = pages.all()
        for depth in range(len(path), 0, -1):
            hit = entries.get(path[depth - 1])
            if hit is not None and hit[0] not in found and hit[2] >= oldest:
                found[hit[0]] = depth * self._page
        return found

    def take_outgoing(self) -> list[bytes]:
        """Encode the queued hints into messages of at most ``max_message_bytes``."""
        if not self._outbox:
            return []
        messages: list[bytes] = []
        urls: dict[str, int] = {}
        entries: list[bytes] = []
        size = _HEADER.size + 1
        for prefix, (url, depth) in self._outbox.items():
            url_cost = 0 if url in urls else 1 + len(url.encode())
            if entries and (
                size + url_cost + _ENTRY.size > self._max_bytes or len(urls) + (url_cost > 0) > MAX_URLS_PER_MESSAGE
            ):
                messages.append(self._encode(urls, entries))
                urls, entries, size = {}, [], _HEADER.size + 1
                url_cost = 1 + len(url.encode())
            index = urls.setdefault(url, len(urls))
            entries.append(_ENTRY.pack(prefix, depth, index))
            size += url_cost + _ENTRY.size
        messages.append(self._encode(urls, entries))
        self.sent += len(self._outbox)
        self._outbox.clear()
        return messages

    def _encode(self, urls: dict[str, int], entries: list[bytes]) -> bytes:
        out = bytearray(_HEADER.pack(HINT_VERSION, self._page, HASH_CHECK))
        out.append(len(urls))
        for url in urls:  # dicts keep insertion order: index order
            raw = url.encode()
            out.append(len(raw))
            out += raw
        for entry in entries:
            out += entry
        return bytes(out)

    def receive(self, msg: bytes) -> None:
        """A peer's hints (version 1: made now; version 2: made its age ago). Malformed, foreign-version or
        foreign-hash messages are counted and ignored."""
        try:
            age_s = 0.0
            if msg[:1] == bytes((AGED_HINT_VERSION,)):
                _, age_ms = _AGED.unpack_from(msg, 0)
                age_s, msg = age_ms / 1000, msg[_AGED.size :]
            version, page, check = _HEADER.unpack_from(msg, 0)
            if version != HINT_VERSION or page != self._page or check != HASH_CHECK:
                self.rejected += 1
                return
            offset = _HEADER.size
            count = msg[offset]
            offset += 1
            urls = []
            for _ in range(count):
                length = msg[offset]
                urls.append(msg[offset + 1 : offset + 1 + length].decode())
                offset += 1 + length
            if (len(msg) - offset) % _ENTRY.size:
                raise ValueError("truncated entry")
            made = self._clock() - age_s
            if age_s >= self._ttl:
                return
            for prefix, depth, index in _ENTRY.iter_unpack(msg[offset:]):
                url = urls[index]
                known = self._map.get(prefix)
                if age_s and known is not None and known[2] >= made:
                    continue  # an old hint never replaces what we learned since
                self._put(prefix, url, depth, made)
                self.received += 1
        except (IndexError, ValueError, struct.error, UnicodeDecodeError):
            self.rejected += 1

    def _put(self, prefix: int, url: str, depth: int, now: float) -> None:
        entries = self._map
        entries[prefix] = (url, depth, now)
        entries.move_to_end(prefix)
        oldest = now - self._ttl
        while entries and (len(entries) > self._max or next(iter(entries.values()))[2] < oldest):
            entries.popitem(last=False)
