"""Outgoing traffic: every packet carries as many queued broadcasts as fit, then is sealed and counted.

Piggybacking is how SWIM disseminates for free: probes, acks and ping-reqs each take membership updates
from the transmit-limited queue, then the delegate's broadcasts, up to MAX_PACKET_BYTES after sealing.
"""

from __future__ import annotations

from collections.abc import Callable

from mesh.actions import Action, SendPacket, StreamRequest
from mesh.broadcast import BroadcastQueue
from mesh.codec import compound, encode_message, seal_packet
from mesh.delegate import Delegate
from mesh.keyring import Keyring
from mesh.limits import (
    COMPOUND_HEADER_BYTES,
    COMPOUND_PART_OVERHEAD,
    ENCRYPTION_OVERHEAD,
    MAX_COMPOUND_PARTS,
    MAX_PACKET_BYTES,
    MAX_USER_MSG_BYTES,
    USER_MSG_HEADER_BYTES,
)
from mesh.messages import User
from mesh.metrics import Counters


class Outbox:
    __slots__ = ("_actions", "_broadcasts", "_cluster_size", "_counters", "_delegate", "_keyring")

    def __init__(
        self,
        *,
        keyring: Keyring | None,
        broadcasts: BroadcastQueue,
        delegate: Delegate | None,
        counters: Counters,
        cluster_size: Callable[[], int],
    ) -> None:
        self._keyring = keyring
        self._broadcasts = broadcasts
        self._delegate = delegate
        self._counters = counters
        self._cluster_size = cluster_size
        self._actions: list[Action] = []

    def drain(self) -> list[Action]:
        actions, self._actions = self._actions, []
        return actions

    @property
    def has_broadcasts(self) -> bool:
        """Whether a gossip round could have anything to send."""
        return bool(self._broadcasts) or self._delegate is not None

    def packet(self, addr: str, parts: list[bytes], *, require_payload: bool = False) -> bool:
        """Send encoded ``parts`` plus as many queued broadcasts as fit. With ``require_payload``, send
        nothing (and return False) when there is nothing queued."""
        overhead = ENCRYPTION_OVERHEAD if self._keyring is not None else 0
        budget = MAX_PACKET_BYTES - 1 - overhead - COMPOUND_HEADER_BYTES
        budget -= sum(len(p) + COMPOUND_PART_OVERHEAD for p in parts)
        room = MAX_COMPOUND_PARTS - len(parts)
        extra = self._broadcasts.get(COMPOUND_PART_OVERHEAD, budget, self._cluster_size(), room)
        if self._delegate is not None and room > len(extra):
            budget -= sum(len(p) + COMPOUND_PART_OVERHEAD for p in extra)
            per_msg = COMPOUND_PART_OVERHEAD + USER_MSG_HEADER_BYTES
            for payload in self._delegate.get_broadcasts(per_msg, budget):
                if len(extra) >= room or len(payload) > MAX_USER_MSG_BYTES:
                    continue  # a delegate bug: never let it break the packet bounds
                if budget < len(payload) + per_msg:
                    break
                budget -= len(payload) + per_msg
                extra.append(encode_message(User(payload)))
        if require_payload and not extra:
            return False
        data = seal_packet(compound(parts + extra), self._keyring)
        self._counters.packets_out += 1
        self._counters.bytes_out += len(data)
        self._actions.append(SendPacket(addr, data))
        return True

    def stream(self, token: int, addr: str, frame: bytes, deadline: float) -> None:
        self._counters.streams_out += 1
        self._counters.bytes_out += len(frame)
        self._actions.append(StreamRequest(token, addr, frame, deadline))
