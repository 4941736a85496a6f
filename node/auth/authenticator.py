"""Credentials to identities: the API-key check (a pure core; the clock and the key lookup come in)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

from node.auth.identity import Identity
from node.auth.keys import KeyFormatError, ParsedKey, digest_matches, key_digest, parse_key
from node.auth.records import KeyRecord

#: The bootstrap admin key's identity: tenant "default" (an admin acts on the cluster, not a tenant).
BOOTSTRAP_SUBJECT: Final = "bootstrap"

Failure = Literal["missing", "malformed", "unknown", "revoked", "expired", "invalid_token"]


@dataclass(frozen=True, slots=True)
class AuthFailure:
    """Why a credential was refused. Every failure is the same 401 to the client (no oracle for which
    ids exist); ``reason`` is for metrics and logs (it never contains the secret)."""

    reason: Failure
    key_id: str | None = None

    @property
    def message(self) -> str:
        if self.reason == "missing":
            return "You didn't provide an API key. Send it as 'Authorization: Bearer <key>' or 'x-api-key: <key>'."
        if self.reason == "invalid_token":
            return "Invalid bearer token."
        if self.reason == "expired" and self.key_id is None:
            return "The bearer token has expired or is not yet valid."
        return "Incorrect API key provided."


class ApiKeyAuthenticator:
    """Checks ``smg-<id>-<secret>`` keys against the cluster's key table and the bootstrap key."""

    def __init__(
        self,
        lookup: Callable[[str], KeyRecord | None],
        *,
        bootstrap_key: str = "",
        clock: Callable[[], float],
    ) -> None:
        """Raises KeyFormatError for a bootstrap key that is not a key of ours."""
        self._lookup = lookup
        self._clock = clock
        self._bootstrap: tuple[str, str] | None = None
        if bootstrap_key:
            parsed = parse_key(bootstrap_key)
            self._bootstrap = (parsed.key_id, key_digest(parsed.key_id, parsed.secret))

    def authenticate(self, credential: str | None) -> Identity | AuthFailure:
        if not credential:
            return AuthFailure("missing")
        try:
            presented = parse_key(credential)
        except KeyFormatError:
            return AuthFailure("malformed")
        if self._bootstrap is not None and presented.key_id == self._bootstrap[0]:
            if digest_matches(presented, self._bootstrap[1]):
                return Identity(subject=BOOTSTRAP_SUBJECT, tenant="default", role="admin")
            return AuthFailure("unknown", presented.key_id)
        return self._check(presented, self._lookup(presented.key_id))

    def _check(self, presented: ParsedKey, record: KeyRecord | None) -> Identity | AuthFailure:
        if not digest_matches(presented, record.digest if record is not None else None) or record is None:
            return AuthFailure("unknown", presented.key_id)
        if record.revoked_at:
            return AuthFailure("revoked", record.key_id)
        if record.expires_at and self._clock() >= record.expires_at:
            return AuthFailure("expired", record.key_id)
        return record.identity()
