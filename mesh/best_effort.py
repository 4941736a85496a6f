"""A bounded, lossy broadcast channel: small messages spread by epidemic gossip, never stored.

For soft, high-rate hints (which worker holds which prefix) that must not become a replicated log: each
message is sent ``retransmit_mult * ceil(log10(n + 1))`` times by its origin and by every node that
receives it for the first time (so it reaches the nodes the origin's few sends missed), then forgotten.
Duplicates are recognised by a digest kept in a bounded recent set. When more is published than gossip
carries, the most-sent messages are dropped first (``BroadcastQueue``): the channel loses, never grows.
Nothing travels by push-pull: a late joiner sees only what is published after it joined.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable

from mesh.broadcast import BroadcastQueue
from mesh.channels import MAX_CHANNEL_MSG_BYTES

#: Digests of recently seen messages kept to drop gossip duplicates.
DEFAULT_MAX_SEEN = 16_384
#: Messages waiting to be gossiped; past it the most-sent are dropped.
DEFAULT_MAX_QUEUED = 1024
#: Most messages one get_broadcasts call hands out.
MAX_PER_PACKET = 64


def _digest(msg: bytes) -> bytes:
    return hashlib.blake2b(msg, digest_size=12).digest()


class BestEffortBroadcast:
    """A mesh Delegate (or a channel of ``Channels``). Not thread-safe: one owner, the mesh's loop."""

    def __init__(
        self,
        on_message: Callable[[bytes], None],
        *,
        retransmit_mult: int = 4,
        cluster_size: Callable[[], int] = lambda: 1,
        max_seen: int = DEFAULT_MAX_SEEN,
        max_queued: int = DEFAULT_MAX_QUEUED,
    ) -> None:
        self._on_message = on_message
        self._queue = BroadcastQueue(retransmit_mult)
        self._cluster_size = cluster_size
        self._seen: OrderedDict[bytes, None] = OrderedDict()
        self._max_seen = max_seen
        self._max_queued = max_queued
        self.published = 0
        self.received = 0
        self.duplicates = 0
        self.oversized = 0

    def publish(self, msg: bytes) -> bool:
        """Queue ``msg`` for the other nodes (not delivered locally). False if it is too big to send."""
        if not msg or len(msg) > MAX_CHANNEL_MSG_BYTES:
            self.oversized += 1
            return False
        self._remember(_digest(msg))
        self._enqueue(msg)
        self.published += 1
        return True

    @property
    def queued(self) -> int:
        return len(self._queue)

    # -- Delegate --

    def local_state(self, join: bool) -> bytes:
        return b""

    def merge_remote_state(self, state: bytes, join: bool) -> None:
        return None

    def get_broadcasts(self, overhead: int, limit: int) -> list[bytes]:
        return self._queue.get(overhead, limit, max(1, self._cluster_size()), MAX_PER_PACKET)

    def notify_msg(self, msg: bytes) -> None:
        digest = _digest(msg)
        if digest in self._seen:
            self.duplicates += 1
            return
        self._remember(digest)
        self.received += 1
        self._enqueue(msg)  # relay: the origin's few sends may have missed some nodes
        self._on_message(msg)

    def _enqueue(self, msg: bytes) -> None:
        self._queue.queue(msg)
        if len(self._queue) > self._max_queued:
            self._queue.prune(self._max_queued)

    def _remember(self, digest: bytes) -> None:
        self._seen[digest] = None
        if len(self._seen) > self._max_seen:
            self._seen.popitem(last=False)
