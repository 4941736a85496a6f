"""The issuer's signing keys over HTTPS: OIDC discovery (``<issuer>/.well-known/openid-configuration`` ->
``jwks_uri``) or a configured JWKS URL, cached, refreshed every ``refresh_s`` and at once on a token whose
``kid`` is unknown (a key rotation), at most every JWKS_MIN_REFETCH_S so tokens with made-up kids cannot
make us hammer the issuer. A failed fetch keeps the keys we have (logged); only HTTPS is spoken.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
from collections.abc import Callable, Mapping
from typing import Final

import aiohttp
from jwt import PyJWK, PyJWKError

log = logging.getLogger(__name__)

#: Unknown-kid refetches are at most this frequent (an issuer rotates keys in hours, attackers in ms).
JWKS_MIN_REFETCH_S: Final = 10.0
#: A JWKS or discovery document larger than this is refused (a JWKS is a few KB).
MAX_JWKS_BYTES: Final = 256 * 1024
#: Keys kept from one JWKS.
MAX_JWKS_KEYS: Final = 64
FETCH_TIMEOUT_S: Final = 5.0


class JwksError(Exception):
    """The issuer's keys could not be fetched or parsed."""


def parse_jwks(raw: bytes) -> dict[str, PyJWK]:
    """The usable keys of a JWKS document by kid (keys without a kid are kept under ""). Raises JwksError."""
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise JwksError(f"JWKS is not JSON: {exc}") from None
    keys = doc.get("keys") if isinstance(doc, dict) else None
    if not isinstance(keys, list):
        raise JwksError("JWKS has no 'keys' list")
    out: dict[str, PyJWK] = {}
    for entry in keys[:MAX_JWKS_KEYS]:
        if not isinstance(entry, dict) or entry.get("use", "sig") != "sig":
            continue
        try:
            key = PyJWK(entry)
        except PyJWKError:
            continue  # an algorithm or key type we do not support: skipped, the others stay usable
        if key.key_type in ("oct",):
            continue  # symmetric keys are never accepted from a JWKS
        kid = entry.get("kid")
        out[kid if isinstance(kid, str) else ""] = key
    return out


class JwksCache:
    """Owned by the event loop. ``keys()`` is what verification uses; ``refresh_for(kid)`` fetches again
    when a token names a key we do not have."""

    def __init__(
        self,
        *,
        issuer: str,
        jwks_url: str,
        ssl_context: ssl.SSLContext,
        refresh_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._issuer = issuer.rstrip("/")
        self._jwks_url = jwks_url
        self._ssl = ssl_context
        self._refresh_s = refresh_s
        self._clock = clock
        self._keys: dict[str, PyJWK] = {}
        self._fetched_at: float | None = None
        self._lock = asyncio.Lock()
        self.fetches = 0
        self.failures = 0

    def keys(self) -> Mapping[str, PyJWK]:
        return self._keys

    def stale(self) -> bool:
        return self._fetched_at is None or self._clock() - self._fetched_at >= self._refresh_s

    async def refresh(self, *, force: bool = False) -> None:
        """Fetch the keys if stale (or ``force`` and not fetched within JWKS_MIN_REFETCH_S)."""
        async with self._lock:
            since = None if self._fetched_at is None else self._clock() - self._fetched_at
            if since is not None and (since < JWKS_MIN_REFETCH_S or (not force and since < self._refresh_s)):
                return
            self._fetched_at = self._clock()
            try:
                self._keys = await self._fetch()
                self.fetches += 1
            except (JwksError, aiohttp.ClientError, TimeoutError) as exc:
                self.failures += 1
                log.warning("JWKS of %s not refreshed, keeping %d key(s): %s", self._issuer, len(self._keys), exc)

    async def _fetch(self) -> dict[str, PyJWK]:
        timeout = aiohttp.ClientTimeout(total=FETCH_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            url = self._jwks_url or await self._discover(session)
            return parse_jwks(await self._get(session, url))

    async def _discover(self, session: aiohttp.ClientSession) -> str:
        raw = await self._get(session, f"{self._issuer}/.well-known/openid-configuration")
        try:
            doc = json.loads(raw)
        except ValueError as exc:
            raise JwksError(f"discovery document is not JSON: {exc}") from None
        if not isinstance(doc, dict) or str(doc.get("issuer", "")).rstrip("/") != self._issuer:
            raise JwksError("discovery document names another issuer")
        url = doc.get("jwks_uri")
        if not isinstance(url, str) or not url.startswith("https://"):
            raise JwksError("discovery document has no https jwks_uri")
        return url

    async def _get(self, session: aiohttp.ClientSession, url: str) -> bytes:
        if not url.startswith("https://"):
            raise JwksError(f"{url}: only https is fetched")
        async with session.get(url, ssl=self._ssl) as resp:
            if resp.status != 200:
                raise JwksError(f"{url}: HTTP {resp.status}")
            raw = await resp.content.read(MAX_JWKS_BYTES + 1)
            if len(raw) > MAX_JWKS_BYTES:
                raise JwksError(f"{url}: larger than {MAX_JWKS_BYTES} bytes")
            return raw
