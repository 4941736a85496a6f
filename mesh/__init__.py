"""SWIM membership with Lifeguard for the smg-node mesh: a sans-IO core (:class:`Swim`) and an asyncio
shell (:class:`Mesh`). Knows nothing of LLMs; see mesh/README.md for the design and wire format.

This module is the membership half's public API (the replicated state's is :mod:`mesh.state`); an
application imports these names, never the modules behind them.

`Mesh`, `Swim` and `Keyring` (the runtime, the protocol core and AES-GCM) load on first use: a node that
runs without a mesh (the demo) or only checks its cluster config never imports them, their codec, TLS or
`cryptography` (~0.3 s of a start). `tests/test_lazy_imports.py` holds this.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from mesh.addr import WILDCARD_HOSTS, join_addr
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
from mesh.member import Member, MemberState, NodeMeta, check_addr, check_member_addr
from mesh.metrics import MeshMetrics

if TYPE_CHECKING:
    from mesh.keyring import Keyring
    from mesh.runtime import Mesh
    from mesh.swim import Swim

# name -> the module that defines it, imported by __getattr__ on first access.
_LAZY = {"Keyring": "mesh.keyring", "Mesh": "mesh.runtime", "Swim": "mesh.swim"}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'mesh' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


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
