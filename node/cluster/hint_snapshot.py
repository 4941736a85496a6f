"""Recent routing hints for a node that joins late: a bounded snapshot carried by the join push-pull.

Cache-affinity hints (node/routing/affinity.py) travel on the best-effort channel (mesh/best_effort.py), which
never repeats old messages: a node that joins or restarts would start with no hints, and the next turns of
conversations already under way would go to workers that do not hold their prefixes. So every node keeps the
hint messages it published or received lately — the newest ``HINT_SNAPSHOT_MAX_BYTES`` of them — and hands
them over, each with its age, in the push-pull of a join (both sides of it; periodic push-pulls carry nothing,
so steady-state traffic is unchanged). The joiner applies them as aged messages (``affinity.aged``): they
expire when they would have where they were made, and never replace a fresher hint. A joiner records them too,
so it can pass them on in turn.

Wire (one channel section of a push-pull state): ``B`` version, then entries ``>IH`` age in ms, length, and
a version-1 hint message, in the order recorded (oldest first). Unknown versions and truncated entries are
counted and dropped.
"""

from __future__ import annotations

import struct
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Final

from node.routing.affinity import MAX_AGE_MS, aged

SNAPSHOT_VERSION: Final = 1
#: Newest hint messages kept and sent per join. A routing decision makes ~8 hints of 13 B, so 256 KiB hold the
#: last ~2,500 decisions (a couple of minutes at tens of requests/s: the conversations still under way); sent
#: once per join, far below the push-pull bound (MAX_USER_STATE_BYTES, 4 MiB).
HINT_SNAPSHOT_MAX_BYTES: Final = 256 * 1024
_ENTRY = struct.Struct(">IH")


class HintSnapshot:
    """A mesh Delegate for one channel of ``mesh.channels.Channels``. Not thread-safe: the mesh's loop."""

    def __init__(
        self,
        on_hints: Callable[[bytes], None],
        *,
        max_bytes: int = HINT_SNAPSHOT_MAX_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._on_hints = on_hints
        self._max_bytes = max_bytes
        self._clock = clock
        #: message -> when it was made (our clock), oldest first.
        self._recent: OrderedDict[bytes, float] = OrderedDict()
        self._bytes = 0
        self.sent = 0
        self.received = 0
        self.malformed = 0

    def __len__(self) -> int:
        return len(self._recent)

    def record(self, msg: bytes, age_s: float = 0.0) -> None:
        """A hint message published or received ``age_s`` seconds after it was made."""
        if not msg or len(msg) + _ENTRY.size > self._max_bytes or len(msg) > 0xFFFF:
            return
        made = self._clock() - age_s
        if msg in self._recent:
            return
        self._recent[msg] = made
        self._bytes += _ENTRY.size + len(msg)
        while self._bytes > self._max_bytes:
            old, _ = self._recent.popitem(last=False)
            self._bytes -= _ENTRY.size + len(old)

    # -- Delegate --

    def local_state(self, join: bool) -> bytes:
        if not join or not self._recent:
            return b""
        now = self._clock()
        out = bytearray((SNAPSHOT_VERSION,))
        for msg, made in self._recent.items():
            out += _ENTRY.pack(min(MAX_AGE_MS, max(0, round((now - made) * 1000))), len(msg))
            out += msg
        self.sent += 1
        return bytes(out)

    def merge_remote_state(self, state: bytes, join: bool) -> None:
        if not state:
            return
        if state[0] != SNAPSHOT_VERSION:
            self.malformed += 1
            return
        view = memoryview(state)
        offset = 1
        while offset < len(view):
            if len(view) - offset < _ENTRY.size:
                self.malformed += 1
                return
            age_ms, size = _ENTRY.unpack_from(view, offset)
            offset += _ENTRY.size
            if size > len(view) - offset:
                self.malformed += 1
                return
            msg = bytes(view[offset : offset + size])
            offset += size
            self.record(msg, age_ms / 1000)
            self._on_hints(aged(msg, age_ms / 1000))
            self.received += 1

    def get_broadcasts(self, overhead: int, limit: int) -> list[bytes]:
        return []

    def notify_msg(self, msg: bytes) -> None:
        return None
