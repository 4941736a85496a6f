"""API keys: format, hashing and constant-time verification (a pure core: no clock, no I/O).

A key reads ``smg-<id>-<secret>``: ``id`` is 8 characters of [a-z0-9] and public (it names the key in
listings, logs and the admin API, and is how a presented key is looked up); ``secret`` is 32 random bytes,
URL-safe base64 (43 characters). Only ``sha256(id ":" secret)`` is stored.

Why sha256 and not argon2/bcrypt: those slow hashes protect *low-entropy* secrets (passwords) from offline
guessing. A 256-bit random secret cannot be guessed at any hash speed, so a slow hash would add ~50 ms of
CPU to every request (or force a cache of verified keys, itself secret-equivalent) and buy nothing. Hashing
the id with the secret binds a stored hash to its key.

Timing: the id is found by a dict lookup (the id is public, so its timing leaks nothing) and the digest is
compared with ``hmac.compare_digest``; an unknown id is compared against a dummy digest so a miss costs the
same hash and compare as a hit.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from typing import Final, Literal, get_args

Role = Literal["admin", "user", "reader"]
ROLES: Final[tuple[str, ...]] = get_args(Role)

KEY_PREFIX: Final = "smg-"
#: The public id: 8 of 36 characters (41 bits) is unique enough for a bounded table (MAX_KEYS) and short
#: enough to read out; it is not a secret.
KEY_ID_CHARS: Final = 8
_ID_ALPHABET: Final = "abcdefghijklmnopqrstuvwxyz0123456789"
#: 32 random bytes: 256 bits of entropy, the reason a fast hash is enough (see the module docstring).
SECRET_BYTES: Final = 32
_KEY_RE: Final = re.compile(r"smg-([a-z0-9]{8})-([A-Za-z0-9_-]{43})")
#: A presented credential longer than this is not a key (bounds the work an attacker's header costs us).
MAX_PRESENTED_BYTES: Final = 256
_DUMMY_DIGEST: Final = hashlib.sha256(b"smg-node: no such key").hexdigest()


class KeyFormatError(ValueError):
    """A string that is not an API key of ours."""


@dataclass(frozen=True, slots=True)
class ParsedKey:
    key_id: str
    secret: str = ""

    def __repr__(self) -> str:  # never print the secret
        return f"ParsedKey(key_id={self.key_id!r})"


def parse_key(text: str) -> ParsedKey:
    """Split a presented key. Raises KeyFormatError (without echoing the secret)."""
    if len(text) > MAX_PRESENTED_BYTES:
        raise KeyFormatError("not an smg-node API key (too long)")
    match = _KEY_RE.fullmatch(text)
    if match is None:
        raise KeyFormatError("not an smg-node API key (expected smg-<id>-<secret>)")
    return ParsedKey(match.group(1), match.group(2))


def key_digest(key_id: str, secret: str) -> str:
    """What is stored for a key: hex sha256 of ``id:secret``."""
    return hashlib.sha256(f"{key_id}:{secret}".encode()).hexdigest()


def new_key(rand: secrets.SystemRandom | None = None) -> tuple[str, ParsedKey]:
    """A fresh key: (the full text, shown once, and its parts)."""
    rng = rand or secrets.SystemRandom()
    key_id = "".join(rng.choice(_ID_ALPHABET) for _ in range(KEY_ID_CHARS))
    secret = secrets.token_urlsafe(SECRET_BYTES)
    return f"{KEY_PREFIX}{key_id}-{secret}", ParsedKey(key_id, secret)


def digest_matches(presented: ParsedKey, stored_digest: str | None) -> bool:
    """Whether ``presented`` hashes to ``stored_digest`` (None: unknown id, compared against a dummy so
    the miss takes the same time)."""
    actual = key_digest(presented.key_id, presented.secret)
    ok = hmac.compare_digest(actual, stored_digest if stored_digest is not None else _DUMMY_DIGEST)
    return ok and stored_digest is not None
