"""Authentication config (a leaf: node/config.py holds it without importing any HTTP code).

Safe default: ``auth: auto`` enforces API keys once a bootstrap key is given; without one it leaves a node
open only on a loopback address (the local demo) and refuses to start on any other address unless
``--auth none`` says so explicitly (node/config.py checks it with the bind address).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from node.auth.keys import KeyFormatError, parse_key

AuthMode = Literal["auto", "keys", "none"]


class AuthConfigError(ValueError):
    """The auth config cannot work (e.g. an open node on a public address); the message says what to set."""


@dataclass(frozen=True, slots=True)
class AuthConfig:
    auth: AuthMode = field(
        default="auto",
        metadata={
            "help": "who may call the node: keys (API keys required), none (open: say it explicitly on a "
            "non-loopback address), auto (keys when a bootstrap key is given, else open on loopback only)"
        },
    )
    auth_bootstrap_key_file: str = field(
        default="",
        metadata={
            "help": "file holding the bootstrap admin API key (smg-<id>-<secret>); or set the env var "
            "SMG_NODE_AUTH_BOOTSTRAP_KEY; never a flag value"
        },
    )
    # The key itself only from the environment (or YAML): a flag value would show in `ps` and shell history.
    auth_bootstrap_key: str = field(
        default="",
        repr=False,
        metadata={"cli": False, "help": "the bootstrap admin API key itself (environment only)"},
    )

    def __post_init__(self) -> None:
        if self.auth_bootstrap_key and self.auth_bootstrap_key_file:
            raise ValueError("auth_bootstrap_key: give the key by file or by environment, not both")
        if self.auth_bootstrap_key:
            try:
                parse_key(self.auth_bootstrap_key)
            except KeyFormatError as exc:
                raise ValueError(f"auth_bootstrap_key: {exc}") from None

    @property
    def has_bootstrap(self) -> bool:
        return bool(self.auth_bootstrap_key or self.auth_bootstrap_key_file)

    def enforced(self, host: str) -> bool:
        """Whether requests need credentials on a node bound to ``host``. Raises AuthConfigError for an
        open node on a non-loopback address without an explicit ``auth: none``."""
        if self.auth == "keys":
            return True
        if self.auth == "none":
            return False
        if self.has_bootstrap:
            return True
        if is_loopback(host):
            return False
        raise AuthConfigError(
            f"refusing to serve on {host!r} without authentication: give a bootstrap admin key "
            "(--auth-bootstrap-key-file FILE or SMG_NODE_AUTH_BOOTSTRAP_KEY), or say --auth none to run open"
        )


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def read_bootstrap_key(config: AuthConfig) -> str:
    """The bootstrap key from its file (first non-empty line) or the environment value. Raises
    AuthConfigError naming the file (never the key)."""
    if not config.auth_bootstrap_key_file:
        return config.auth_bootstrap_key
    path = Path(config.auth_bootstrap_key_file)
    try:
        lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except OSError as exc:
        raise AuthConfigError(f"auth_bootstrap_key_file {path}: {exc.strerror or exc}") from None
    key = lines[0] if lines else ""
    try:
        parse_key(key)
    except KeyFormatError as exc:
        raise AuthConfigError(f"auth_bootstrap_key_file {path}: {exc}") from None
    return key
