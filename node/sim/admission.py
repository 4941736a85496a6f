"""Admission of sequences to the running batch: at most ``max_running`` at once, the rest wait in FIFO order.

Pure bookkeeping over opaque keys; the engine shell parks a future per waiting key and wakes the keys
``release`` returns.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class AdmissionQueue(Generic[K]):
    def __init__(self, max_running: int) -> None:
        if max_running < 1:
            raise ValueError("max_running must be >= 1")
        self._max_running = max_running
        self._running: set[K] = set()
        self._waiting: OrderedDict[K, None] = OrderedDict()

    @property
    def max_running(self) -> int:
        return self._max_running

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def waiting_keys(self) -> list[K]:
        return list(self._waiting)

    def submit(self, key: K) -> bool:
        """Queue ``key``; True when it runs at once (a free slot and nobody ahead of it).

        Raises:
            ValueError: ``key`` is already running or waiting.
        """
        if key in self._running or key in self._waiting:
            raise ValueError(f"{key!r} was already submitted")
        if not self._waiting and len(self._running) < self._max_running:
            self._running.add(key)
            return True
        self._waiting[key] = None
        return False

    def release(self, key: K) -> list[K]:
        """``key`` stops running or waiting; returns the waiting keys admitted in its place, in order."""
        if key in self._waiting:
            del self._waiting[key]
            return []
        self._running.discard(key)
        admitted: list[K] = []
        while self._waiting and len(self._running) < self._max_running:
            next_key, _ = self._waiting.popitem(last=False)
            self._running.add(next_key)
            admitted.append(next_key)
        return admitted

    def is_running(self, key: K) -> bool:
        return key in self._running
