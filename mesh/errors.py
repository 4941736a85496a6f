"""The mesh's error tree: errors caused by a peer's bytes are distinct from errors in our use of the API."""

from __future__ import annotations


class MeshError(Exception):
    """Base of every error the mesh raises."""


class RemoteProtocolError(MeshError):
    """A peer sent bytes we cannot accept: malformed, oversized, wrong version or unauthenticated.

    The core never lets this escape a packet or stream handler: the input is dropped and counted.
    """


class DecodeError(RemoteProtocolError):
    """A packet or frame is malformed, truncated, oversized or of an unknown version/type."""


class DecryptError(RemoteProtocolError):
    """No key in the keyring authenticates the packet (wrong key, tampering, or an unencrypted packet)."""


class KeyringError(MeshError):
    """A key or key file is invalid (wrong length, bad base64), or a rotation step is not allowed."""


class TlsError(MeshError):
    """A TLS certificate, private key or CA file is unreadable or invalid (checked when the mesh starts)."""


class TransportError(MeshError):
    """A socket operation failed (connect refused or timed out, peer closed early, bind failed)."""


class JoinError(MeshError):
    """No seed answered a join within the configured attempts."""


class MeshStateError(MeshError):
    """The API was used in the wrong lifecycle state (e.g. join before start, or after leave)."""
