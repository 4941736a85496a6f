"""A stored API key: everything but the secret, as the replicated key table holds it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from node.auth.identity import NO_LIMITS, Identity, Limits
from node.auth.keys import KEY_ID_CHARS, ROLES, Role

#: A key's free-text label (shown in listings).
MAX_KEY_NAME_BYTES: Final = 128


@dataclass(frozen=True, slots=True)
class KeyRecord:
    key_id: str
    digest: str
    tenant: str
    role: Role
    name: str = ""
    created_at: float = 0.0
    #: Unix seconds after which the key is refused; 0: never.
    expires_at: float = 0.0
    #: Unix seconds it was revoked at; 0: live. A revoked key stays a record (see api_keys.py).
    revoked_at: float = 0.0
    limits: Limits = field(default=NO_LIMITS)

    def __post_init__(self) -> None:
        """Raises ValueError naming the bad field."""
        if len(self.key_id) != KEY_ID_CHARS:
            raise ValueError(f"key_id: {KEY_ID_CHARS} characters")
        if self.role not in ROLES:
            raise ValueError(f"role: one of {', '.join(ROLES)}, got {self.role!r}")
        if len(self.name.encode()) > MAX_KEY_NAME_BYTES:
            raise ValueError(f"name: at most {MAX_KEY_NAME_BYTES} bytes")
        if self.expires_at < 0:
            raise ValueError("expires_at: >= 0 (0: never)")

    def usable(self, now: float) -> bool:
        return not self.revoked_at and (not self.expires_at or now < self.expires_at)

    def identity(self) -> Identity:
        return Identity(
            subject=f"key:{self.key_id}", tenant=self.tenant, role=self.role, key_id=self.key_id, limits=self.limits
        )

    def public_json(self) -> dict[str, object]:
        """What the admin API shows: never the digest, never the secret."""
        return {
            "id": self.key_id,
            "object": "api_key",
            "name": self.name,
            "tenant": self.tenant,
            "role": self.role,
            "created_at": int(self.created_at),
            "expires_at": int(self.expires_at) or None,
            "revoked_at": int(self.revoked_at) or None,
            "limits": self.limits.to_json(),
        }

    def to_json(self) -> dict[str, object]:
        return {**self.public_json(), "digest": self.digest, "created_at": self.created_at}

    @classmethod
    def from_json(cls, value: object) -> KeyRecord | None:
        """The record stored in an entry, or None if it is not one (a newer or broken peer's: ignored, so
        such a key is refused, never granted)."""
        if not isinstance(value, dict):
            return None
        limits = value.get("limits")
        try:
            return cls(
                key_id=_str(value["id"]),
                digest=_str(value["digest"]),
                tenant=_str(value["tenant"]),
                role=_str(value["role"]),  # type: ignore[arg-type]  # checked in __post_init__
                name=_str(value.get("name", "")),
                created_at=_num(value.get("created_at", 0)),
                expires_at=_num(value.get("expires_at") or 0),
                revoked_at=_num(value.get("revoked_at") or 0),
                limits=Limits(**limits) if isinstance(limits, dict) else NO_LIMITS,
            )
        except (KeyError, TypeError, ValueError):
            return None


def _str(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError("expected a string")
    return value


def _num(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError("expected a number")
    return float(value)
