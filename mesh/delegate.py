"""How an application plugs into the mesh (memberlist's delegate.go), without the mesh knowing what it is.

:class:`Delegate` carries opaque application state: full state in every push-pull, small broadcasts
piggybacked on gossip. The cluster-state CRDT implements it. :class:`EventDelegate` hears about
membership changes. Both are called synchronously from the core, on the thread that drives it, so they
must be fast and must not call back into the mesh.
"""

from __future__ import annotations

from typing import Protocol

from mesh.member import Member


class Delegate(Protocol):
    def local_state(self, join: bool) -> bytes:
        """Opaque full state sent in a push-pull (``join``: the exchange is a join). A state over
        MAX_USER_STATE_BYTES is not sent at all (the push-pull carries membership only)."""
        ...

    def merge_remote_state(self, state: bytes, join: bool) -> None:
        """Merge a peer's ``local_state``. Must tolerate garbage: the mesh only vouches that an
        authenticated member sent it."""
        ...

    def get_broadcasts(self, overhead: int, limit: int) -> list[bytes]:
        """Messages to piggyback, each costing ``overhead`` extra bytes, all within ``limit`` bytes.
        Each message is at most MAX_USER_MSG_BYTES; the delegate decides how often to repeat one."""
        ...

    def notify_msg(self, msg: bytes) -> None:
        """A peer's broadcast arrived (possibly a duplicate or out of order)."""
        ...


class EventDelegate(Protocol):
    def notify_join(self, member: Member) -> None:
        """A member became alive (new, or back from dead/left)."""
        ...

    def notify_leave(self, member: Member) -> None:
        """A member was declared dead or left (``member.state`` tells which)."""
        ...

    def notify_update(self, member: Member) -> None:
        """An alive member's metadata changed."""
        ...


class NullDelegate:
    """No application state."""

    def local_state(self, join: bool) -> bytes:
        return b""

    def merge_remote_state(self, state: bytes, join: bool) -> None:
        return None

    def get_broadcasts(self, overhead: int, limit: int) -> list[bytes]:
        return []

    def notify_msg(self, msg: bytes) -> None:
        return None


class NullEvents:
    """Ignores membership events."""

    def notify_join(self, member: Member) -> None:
        return None

    def notify_leave(self, member: Member) -> None:
        return None

    def notify_update(self, member: Member) -> None:
        return None
