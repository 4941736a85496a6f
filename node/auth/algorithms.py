"""The JWT signature algorithms a node may accept, and the key type each needs. Asymmetric only: ``none`` is
no signature, and an HMAC algorithm would let anyone holding the issuer's *public* key (as the HMAC secret)
sign tokens."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

#: Algorithm -> the JWK key type (``kty``) it needs.
KEY_TYPES: Final[Mapping[str, str]] = MappingProxyType(
    {
        **{f"RS{n}": "RSA" for n in (256, 384, 512)},
        **{f"PS{n}": "RSA" for n in (256, 384, 512)},
        **{f"ES{n}": "EC" for n in (256, 384, 512)},
        "EdDSA": "OKP",
    }
)
