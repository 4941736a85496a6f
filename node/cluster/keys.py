"""Mesh key rotation without downtime: SIGHUP re-reads --mesh-key-file into the live keyring."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from mesh import KeyringError

if TYPE_CHECKING:
    from mesh import Keyring, Mesh

log = logging.getLogger(__name__)


def apply_keys(ring: Keyring, keys: Sequence[bytes]) -> tuple[int, int]:
    """Make ``ring`` hold exactly ``keys`` with ``keys[0]`` the primary: add, then switch, then remove (the
    ring is never without the key that decrypts a peer's traffic). Returns (added, removed) counts."""
    if not keys:
        raise KeyringError("keyring: at least one key is required")
    before = set(ring.keys)
    for key in keys:
        ring.add(key)
    ring.use(keys[0])
    stale = [key for key in ring.keys if key not in keys]
    for key in stale:
        ring.remove(key)
    return len(set(keys) - before), len(stale)


def reload_key_file(mesh: Mesh, path: str) -> bool:
    """Apply the key file at ``path`` to ``mesh``'s live keyring (see apply_keys). A file that cannot be read
    or parsed is logged and changes nothing, as does a mesh running without encryption. Returns whether the
    keyring was updated."""
    ring = mesh.keyring
    if ring is None:
        log.error("mesh key file not reloaded: this mesh runs unencrypted (restart with --mesh-key-file)")
        return False
    from mesh import Keyring  # cryptography loads only when a mesh has a keyring

    try:
        wanted = Keyring.load(path)
    except KeyringError as exc:
        log.error("mesh key file %s not reloaded, keyring unchanged: %s", path, exc)
        return False
    added, removed = apply_keys(ring, wanted.keys)
    log.info(
        "mesh key file %s reloaded: %d key(s), %d added, %d removed, its first key is the primary",
        path,
        len(ring.keys),
        added,
        removed,
    )
    return True


class KeyFileReload:
    """SIGHUP's action in `smg-node serve`: re-read the key file into the serving node's keyring.

    Installed before the node starts: until it serves (and again while it shuts down) a SIGHUP is logged and
    ignored, instead of ending the process by its default action.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._mesh: Mesh | None = None

    def __call__(self) -> None:
        if self._mesh is None:
            log.warning("SIGHUP while the mesh is not serving: key file not reloaded")
            return
        reload_key_file(self._mesh, self.path)

    @contextlib.contextmanager
    def serving(self, mesh: Mesh | None) -> Iterator[None]:
        """Within the block, SIGHUP reloads the key file into ``mesh``."""
        self._mesh = mesh
        try:
            yield
        finally:
            self._mesh = None
