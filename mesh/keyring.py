"""AES-GCM keyring: the primary key encrypts, every key decrypts, so keys rotate without downtime.

Rotation across a running cluster, one step at a time on every node:
  1. ``add(new)`` everywhere (all nodes can now read both keys),
  2. ``use(new)`` everywhere (nodes write with the new key; the old one still reads stragglers),
  3. ``remove(old)`` everywhere.
No message is lost between any two nodes at any point of this sequence.

Key file format (``MeshConfig.keyring_file``): UTF-8 text, one base64 (standard alphabet, padded) key per
line, 16, 24 or 32 raw bytes each (AES-128/192/256). The first key line is the primary. Blank lines and
lines starting with ``#`` are ignored. Keep it mode 0600.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from mesh.errors import DecryptError, KeyringError
from mesh.limits import NONCE_BYTES, TAG_BYTES

KEY_SIZES = (16, 24, 32)


def _check_key(key: bytes) -> bytes:
    if len(key) not in KEY_SIZES:
        raise KeyringError(f"key: must be 16, 24 or 32 bytes, got {len(key)}")
    return bytes(key)


class Keyring:
    """An ordered set of AES keys; ``keys[0]`` is the primary.

    Not thread-safe; mutate it from the thread (event loop) that owns the mesh.
    """

    def __init__(self, keys: Iterable[bytes], *, nonce: Callable[[int], bytes] = os.urandom) -> None:
        """Raises KeyringError if ``keys`` is empty or a key has the wrong length."""
        self._keys: list[bytes] = []
        self._ciphers: dict[bytes, AESGCM] = {}
        self._nonce = nonce
        for key in keys:
            self.add(key)
        if not self._keys:
            raise KeyringError("keyring: at least one key is required")

    # -- rotation --

    @property
    def keys(self) -> tuple[bytes, ...]:
        return tuple(self._keys)

    @property
    def primary(self) -> bytes:
        return self._keys[0]

    def add(self, key: bytes) -> None:
        """Add a decryption key (no-op if present). Raises KeyringError on a bad length."""
        key = _check_key(key)
        if key not in self._ciphers:
            self._keys.append(key)
            self._ciphers[key] = AESGCM(key)

    def use(self, key: bytes) -> None:
        """Make an installed key the primary. Raises KeyringError if it is not in the ring."""
        if key not in self._ciphers:
            raise KeyringError("use: key is not installed; add it first")
        self._keys.remove(key)
        self._keys.insert(0, key)

    def remove(self, key: bytes) -> None:
        """Remove a key. Raises KeyringError for the primary (switch primary first) or an unknown key."""
        if key not in self._ciphers:
            raise KeyringError("remove: key is not installed")
        if key == self._keys[0]:
            raise KeyringError("remove: cannot remove the primary key; use() another key first")
        self._keys.remove(key)
        del self._ciphers[key]

    # -- sealing --

    def seal(self, plaintext: bytes, aad: bytes) -> bytes:
        """nonce || ciphertext || tag under the primary key, authenticating ``aad`` too."""
        nonce = self._nonce(NONCE_BYTES)
        return nonce + self._ciphers[self._keys[0]].encrypt(nonce, plaintext, aad)

    def open(self, sealed: bytes, aad: bytes) -> bytes:
        """Decrypt with the first key that authenticates. Raises DecryptError if none does."""
        if len(sealed) < NONCE_BYTES + TAG_BYTES:
            raise DecryptError("sealed message shorter than nonce + tag")
        nonce, body = sealed[:NONCE_BYTES], sealed[NONCE_BYTES:]
        for key in self._keys:
            try:
                return self._ciphers[key].decrypt(nonce, body, aad)
            except InvalidTag:
                continue
        raise DecryptError("no key in the keyring authenticates this message")

    # -- files --

    @classmethod
    def parse(cls, text: str) -> Keyring:
        """Parse the key file format (see the module docstring). Raises KeyringError naming the line."""
        keys: list[bytes] = []
        for lineno, raw in enumerate(text.splitlines(), start=1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            try:
                key = base64.b64decode(line, validate=True)
            except (binascii.Error, ValueError) as exc:
                raise KeyringError(f"key file line {lineno}: not base64") from exc
            try:
                keys.append(_check_key(key))
            except KeyringError as exc:
                raise KeyringError(f"key file line {lineno}: {exc}") from exc
        return cls(keys)

    @classmethod
    def load(cls, path: str | Path) -> Keyring:
        """Read a key file. Raises KeyringError if it is unreadable or invalid."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise KeyringError(f"key file {path}: {exc.strerror or exc}") from exc
        return cls.parse(text)

    def dump(self) -> str:
        """The key file text for this ring, primary first."""
        return "".join(base64.b64encode(key).decode("ascii") + "\n" for key in self._keys)

    @staticmethod
    def generate(size: int = 32) -> bytes:
        """A fresh random key of ``size`` bytes (16, 24 or 32)."""
        return _check_key(os.urandom(size))
