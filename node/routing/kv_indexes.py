"""The KV-event indexes of a node: one ``KvIndex`` per served model.

Models differ in block size and in what a token id means, so one index over every model's workers would
learn the first model's block size and count every other model's blocks as orphans (never matched). Each
model's index learns its own block size; its workers feed it and its policies read it. The bound
(``max_blocks``) holds per model.
"""

from __future__ import annotations

from node.routing.kv_index import KvIndex


class KvIndexes:
    def __init__(self, max_blocks: int) -> None:
        """Raises ValueError when ``max_blocks`` < 1."""
        if max_blocks < 1:
            raise ValueError("max_blocks must be >= 1")
        self._max_blocks = max_blocks
        self._by_model: dict[str | None, KvIndex] = {}

    def of(self, model: str | None) -> KvIndex:
        """The index of ``model`` (None: a pool that does not tell models apart), made on first use."""
        index = self._by_model.get(model)
        if index is None:
            index = self._by_model[model] = KvIndex(self._max_blocks)
        return index

    def get(self, model: str | None) -> KvIndex | None:
        return self._by_model.get(model)

    def items(self) -> list[tuple[str | None, KvIndex]]:
        return list(self._by_model.items())

    def forget_worker(self, worker_url: str) -> None:
        """``worker_url`` left the pool: drop it from every model's index."""
        for index in self._by_model.values():
            index.forget_worker(worker_url)
