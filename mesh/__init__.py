"""SWIM membership with Lifeguard for the smg-node mesh: a sans-IO core (:class:`Swim`) and an asyncio
shell (:class:`Mesh`). Knows nothing of LLMs; see mesh/README.md for the design and wire format.

This module is the membership half's public API (the replicated state's is :mod:`mesh.state`); an
application imports these names, never the modules behind them.
"""

from mesh.best_effort import BestEffortBroadcast
from mesh.channels import MAX_CHANNEL_MSG_BYTES, Channels
from mesh.config import MeshConfig
from mesh.delegate import Delegate, EventDelegate, NullDelegate, NullEvents
from mesh.errors import (
    DecodeError,
    DecryptError,
    JoinError,
    KeyringError,
    MeshError,
    MeshStateError,
    RemoteProtocolError,
    TlsError,
    TransportError,
)
from mesh.keyring import Keyring
from mesh.member import Member, MemberState, NodeMeta, check_addr, check_member_addr
from mesh.metrics import MeshMetrics
from mesh.runtime import Mesh
from mesh.swim import Swim
from mesh.transport import WILDCARD_HOSTS, join_addr

__all__ = [
    "MAX_CHANNEL_MSG_BYTES",
    "WILDCARD_HOSTS",
    "BestEffortBroadcast",
    "Channels",
    "DecodeError",
    "DecryptError",
    "Delegate",
    "EventDelegate",
    "JoinError",
    "Keyring",
    "KeyringError",
    "Member",
    "MemberState",
    "Mesh",
    "MeshConfig",
    "MeshError",
    "MeshMetrics",
    "MeshStateError",
    "NodeMeta",
    "NullDelegate",
    "NullEvents",
    "RemoteProtocolError",
    "Swim",
    "TlsError",
    "TransportError",
    "check_addr",
    "check_member_addr",
    "join_addr",
]
