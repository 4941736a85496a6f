"""Several application delegates sharing the mesh's one Delegate slot, each on its own channel.

Wire: a broadcast is ``[channel id: 1 byte][inner message]``; a push-pull state is a sequence of
``[channel id: 1 byte][length: 4 bytes big-endian][inner state]`` sections (empty states omitted). Channel
ids are the application's to assign and must agree across nodes; a message or section of an unknown
channel is ignored (a newer peer may carry channels we do not have), a truncated one is counted as
malformed and dropped. Channels are served in the order given when packets have room: the first channel
(typically the replicated state) is never starved by a later, best-effort one.

A channel may be attached after the mesh started (its id known up front or not): until then its traffic is
dropped, which every delegate here tolerates (push-pull repairs).
"""

from __future__ import annotations

import logging
import struct

from mesh.delegate import Delegate
from mesh.limits import MAX_USER_MSG_BYTES

log = logging.getLogger(__name__)

#: Bytes a channel adds to each broadcast.
CHANNEL_OVERHEAD = 1
#: Largest broadcast a channel's delegate may produce.
MAX_CHANNEL_MSG_BYTES = MAX_USER_MSG_BYTES - CHANNEL_OVERHEAD

_SECTION = struct.Struct(">BI")


class Channels:
    """A Delegate multiplexing channel delegates. Not thread-safe: called by the mesh core only."""

    def __init__(self) -> None:
        self._channels: dict[int, Delegate] = {}
        self.malformed = 0
        self.unknown = 0

    def attach(self, channel: int, delegate: Delegate) -> None:
        """Serve ``delegate`` on ``channel`` (0..255). Raises ValueError for a bad or taken id."""
        if not 0 <= channel <= 255:
            raise ValueError(f"channel id must be 0..255, got {channel}")
        if channel in self._channels:
            raise ValueError(f"channel {channel} is taken")
        self._channels[channel] = delegate

    def local_state(self, join: bool) -> bytes:
        out = bytearray()
        for channel, delegate in self._channels.items():
            state = delegate.local_state(join)
            if state:
                out += _SECTION.pack(channel, len(state))
                out += state
        return bytes(out)

    def merge_remote_state(self, state: bytes, join: bool) -> None:
        view = memoryview(state)
        offset = 0
        while offset < len(view):
            if len(view) - offset < _SECTION.size:
                self.malformed += 1
                return
            channel, size = _SECTION.unpack_from(view, offset)
            offset += _SECTION.size
            if size > len(view) - offset:
                self.malformed += 1
                return
            section = bytes(view[offset : offset + size])
            offset += size
            delegate = self._channels.get(channel)
            if delegate is None:
                self.unknown += 1
                continue
            delegate.merge_remote_state(section, join)

    def get_broadcasts(self, overhead: int, limit: int) -> list[bytes]:
        out: list[bytes] = []
        room = limit
        for channel, delegate in self._channels.items():
            if room <= overhead + CHANNEL_OVERHEAD:
                break
            prefix = bytes((channel,))
            for msg in delegate.get_broadcasts(overhead + CHANNEL_OVERHEAD, room):
                if len(msg) > MAX_CHANNEL_MSG_BYTES:  # a delegate bug; the mesh would refuse the packet
                    log.warning(
                        "channel %d: dropped a %d-byte broadcast (limit %d)", channel, len(msg), MAX_CHANNEL_MSG_BYTES
                    )
                    continue
                out.append(prefix + msg)
                room -= overhead + CHANNEL_OVERHEAD + len(msg)
        return out

    def notify_msg(self, msg: bytes) -> None:
        if not msg:
            self.malformed += 1
            return
        delegate = self._channels.get(msg[0])
        if delegate is None:
            self.unknown += 1
            return
        delegate.notify_msg(msg[1:])
