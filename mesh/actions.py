"""What the sans-IO core asks its shell to do. The core never touches a socket; it returns these.

Timers are not actions: after every call the shell asks ``Swim.next_deadline()`` and wakes the core
with ``Swim.handle_timer(now)`` at that time.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SendPacket:
    """Send ``data`` as one UDP datagram to ``addr`` ("host:port"). Best effort: failures are ignored."""

    addr: str
    data: bytes


@dataclass(frozen=True, slots=True)
class StreamRequest:
    """Open a TCP stream to ``addr``, write the frame ``data``, read one reply frame, close.

    Report the outcome with ``Swim.handle_stream_reply(now, token, reply_or_None)``; give up (report
    ``None``) at ``deadline`` on the core's clock.
    """

    token: int
    addr: str
    data: bytes
    deadline: float


Action = SendPacket | StreamRequest
