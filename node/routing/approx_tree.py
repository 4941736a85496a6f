"""cache_aware's approximate prefix tree: which worker was sent which prompt prefix, page by page.

It is the gateway's guess at the engines' prefix caches, built from its own routing decisions, for workers
that publish no KV events. A node is one page (``page_size`` tokens) named by its prefix hash
(``block_hashes``), so a path from the root is a prompt prefix; a node holds the bitmask of workers that were
sent that prefix. Memory is bounded by ``max_pages`` nodes, all workers together.

Eviction is least-recently-used, leaves first, in O(1) per node: an insertion touches its path from the leaf
up to the root, so every node is more recent than all of its descendants and the least recent node is always
a leaf. Per-worker recency is not kept: a page shared by several workers lives as long as any of them is
sent it.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable

from node.routing.block_hashes import BlockHashes, bits_of, leading_depths


class ApproxTree:
    def __init__(self, page_size: int, max_pages: int) -> None:
        if page_size < 1 or max_pages < 1:
            raise ValueError("page_size and max_pages must be >= 1")
        self._page_size = page_size
        self._max_pages = max_pages
        self._nodes: OrderedDict[int, int] = OrderedDict()  # prefix hash -> worker bitmask, oldest first
        self._bits: dict[str, int] = {}
        self._urls_by_bit: dict[int, str] = {}
        self._pages: dict[int, int] = {}  # worker bit -> nodes holding it
        self._evicted = 0

    @property
    def page_size(self) -> int:
        return self._page_size

    def __len__(self) -> int:
        return len(self._nodes)

    @property
    def evicted_pages(self) -> int:
        return self._evicted

    def pages_of(self, url: str) -> int:
        bit = self._bits.get(url)
        return 0 if bit is None else self._pages[bit]

    def match(self, hashes: BlockHashes) -> dict[str, int]:
        """Leading full pages of the prompt each worker was sent (workers with none omitted)."""
        if not self._nodes:
            return {}
        depths = leading_depths(hashes.resized(self._page_size), self._nodes.get)
        return {self._urls_by_bit[bit]: depth for bit, depth in depths.items()}

    def insert(self, hashes: BlockHashes, url: str) -> None:
        """Record that the prompt was sent to ``url``: every full page of it, now most recently used."""
        path = hashes.resized(self._page_size).all()
        if not path:
            return
        bit = self._bits.get(url)
        if bit is None:
            bit = self._add_worker(url)
        mask_bit = 1 << bit
        nodes = self._nodes
        masks = list(map(nodes.get, path))
        added = 0
        for i in [i for i, m in enumerate(masks) if m is None or not m & mask_bit]:
            nodes[path[i]] = (masks[i] or 0) | mask_bit
            added += 1
        self._pages[bit] += added
        # Leaf first, root last: the root ends most recent (see the module docstring).
        deque(map(nodes.move_to_end, reversed(path)), maxlen=0)
        while len(nodes) > self._max_pages:
            _, mask = nodes.popitem(last=False)
            self._evicted += 1
            for b in bits_of(mask):
                self._pages[b] -= 1

    def retain(self, urls: Iterable[str]) -> None:
        """Forget workers not in ``urls`` (an O(tree) pass: for membership changes, not health flaps)."""
        present = set(urls)
        gone = [url for url in self._bits if url not in present]
        if not gone:
            return
        keep = ~sum(1 << self._bits[url] for url in gone)
        for url in gone:
            bit = self._bits.pop(url)
            del self._urls_by_bit[bit]
            del self._pages[bit]
        # A worker's pages are prefix-closed (insertion marks whole paths, eviction takes leaves), so a node
        # left with no worker has none below it either.
        self._nodes = OrderedDict((h, m & keep) for h, m in self._nodes.items() if m & keep)

    def _add_worker(self, url: str) -> int:
        bit = next(i for i in range(len(self._urls_by_bit) + 1) if i not in self._urls_by_bit)
        self._bits[url] = bit
        self._urls_by_bit[bit] = url
        self._pages[bit] = 0
        return bit
