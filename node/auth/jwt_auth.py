"""JWT bearer tokens as identities: the JWKS cache (HTTPS) feeding the pure check (jwt_verifier.py), and a
bounded cache of verified tokens.

Why cache: an RS256/ES256 signature check costs ~0.1 ms of CPU, 15-20% of a short request's; a client sends
the same token for its whole lifetime. A verified token is remembered by its sha256 for at most
VERIFIED_TTL_S and never past its exp: a key the issuer retires stops being honoured within that time.
"""

from __future__ import annotations

import hashlib
import logging
import ssl
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Final

from node.auth.authenticator import AuthFailure
from node.auth.config import AuthConfig
from node.auth.identity import Identity
from node.auth.jwks import JwksCache
from node.auth.jwt_verifier import ClaimRules, JwtFailure, Verified, looks_like_jwt, verify_token

log = logging.getLogger(__name__)


#: How long a verified token is trusted without checking its signature again.
VERIFIED_TTL_S: Final = 60.0
#: Verified tokens remembered (~150 bytes each); the least recently used go first.
MAX_VERIFIED: Final = 10_000


class JwtAuthenticator:
    def __init__(self, cache: JwksCache, rules: ClaimRules, *, clock: Callable[[], float] = time.time) -> None:
        self._cache = cache
        self._rules = rules
        self._clock = clock
        self._verified: OrderedDict[bytes, Verified] = OrderedDict()

    @classmethod
    def from_config(cls, config: AuthConfig) -> JwtAuthenticator:
        """Raises OSError/ssl.SSLError for an unreadable --jwt-ca-file."""
        context = ssl.create_default_context(cafile=config.jwt_ca_file or None)
        cache = JwksCache(
            issuer=config.jwt_issuer,
            jwks_url=config.jwt_jwks_url,
            ssl_context=context,
            refresh_s=config.jwt_jwks_refresh_s,
        )
        rules = ClaimRules(
            issuer=config.jwt_issuer,
            audiences=config.jwt_audience,
            algorithms=config.jwt_algorithms,
            leeway_s=config.jwt_leeway_s,
            tenant_claim=config.jwt_tenant_claim,
            role_claim=config.jwt_role_claim,
            default_role=config.jwt_default_role,
        )
        return cls(cache, rules)

    @property
    def cache(self) -> JwksCache:
        return self._cache

    @staticmethod
    def accepts(credential: str) -> bool:
        """Whether ``credential`` has a JWT's shape (checked before `authenticate`, which costs a lookup)."""
        return looks_like_jwt(credential)

    async def authenticate(self, token: str) -> Identity | AuthFailure:
        now = self._clock()
        digest = hashlib.sha256(token.encode()).digest()
        known = self._verified.get(digest)
        if known is not None and now < known.expires_at:
            self._verified.move_to_end(digest)
            return known.identity
        result = await self._verify(token)
        if isinstance(result, AuthFailure):
            self._verified.pop(digest, None)
            return result
        self._verified[digest] = Verified(result.identity, min(result.expires_at, now + VERIFIED_TTL_S))
        if len(self._verified) > MAX_VERIFIED:
            self._verified.popitem(last=False)
        return result.identity

    async def _verify(self, token: str) -> Verified | AuthFailure:
        if self._cache.stale():
            await self._cache.refresh()
        result = verify_token(token, self._cache.keys(), self._rules, now=self._clock())
        if isinstance(result, JwtFailure) and result.reason == "unknown_kid":
            await self._cache.refresh(force=True)  # a rotation: the issuer may have a new key
            result = verify_token(token, self._cache.keys(), self._rules, now=self._clock())
        if isinstance(result, JwtFailure):
            log.debug("bearer token refused: %s %s", result.reason, result.detail)
            return AuthFailure("expired" if result.reason == "expired" else "invalid_token")
        return result
