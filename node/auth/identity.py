"""Identities and limits: what a verified credential grants (values only, no I/O)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from node.auth.keys import ROLES, Role

#: Limits a key can carry; each is per minute (requests, tokens) or at once (concurrent). Bounded so a
#: count always fits the mesh counters' reserved digits.
MAX_LIMIT_VALUE: Final = 10**12


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-identity limits; 0 means no limit of that kind."""

    requests_per_minute: int = 0
    tokens_per_minute: int = 0
    concurrent: int = 0

    def __post_init__(self) -> None:
        """Raises ValueError naming the bad field."""
        for name in ("requests_per_minute", "tokens_per_minute", "concurrent"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_LIMIT_VALUE:
                raise ValueError(f"limits.{name}: an integer in 0..{MAX_LIMIT_VALUE}, got {value!r}")

    @property
    def any(self) -> bool:
        return bool(self.requests_per_minute or self.tokens_per_minute or self.concurrent)

    def to_json(self) -> dict[str, int]:
        return {
            "requests_per_minute": self.requests_per_minute,
            "tokens_per_minute": self.tokens_per_minute,
            "concurrent": self.concurrent,
        }


NO_LIMITS: Final = Limits()


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a request runs as. ``subject`` names it in logs and counters (``key:<id>``, ``bootstrap``)."""

    subject: str
    tenant: str
    role: Role
    key_id: str | None = None
    limits: Limits = field(default=NO_LIMITS)

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role: one of {', '.join(ROLES)}, got {self.role!r}")
