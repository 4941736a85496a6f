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

from node.auth.algorithms import KEY_TYPES
from node.auth.client_cert import CertRule
from node.auth.keys import KeyFormatError, Role, parse_key
from storage.errors import InvalidInput
from storage.validation import check_tenant

AuthMode = Literal["auto", "keys", "none"]


class AuthConfigError(ValueError):
    """The auth config cannot work (e.g. an open node on a public address); the message says what to set."""


@dataclass(frozen=True, slots=True)
class AuthConfig:
    auth: AuthMode = field(
        default="auto",
        metadata={
            "help": "who may call the node: keys (API keys or JWTs required), none (open: say it explicitly on a "
            "non-loopback address), auto (required when a bootstrap key or a JWT issuer is given, else open on "
            "loopback only)"
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

    admin_bind: str = field(
        default="",
        metadata={
            "help": "host:port of a separate listener for the admin API (/admin, /workers, /mesh); the main port "
            "then does not serve it. Empty: on the main port. Admin keys are required on both"
        },
    )
    admin_tls_cert_file: str = field(
        default="",
        metadata={
            "help": "PEM certificate (chain) of the --admin-bind listener (with --admin-tls-key-file); re-read on "
            "SIGHUP. Empty: it serves the main listener's HTTPS (--tls-cert-file), or plain HTTP without one"
        },
    )
    admin_tls_key_file: str = field(default="", metadata={"help": "unencrypted PEM key of --admin-tls-cert-file"})
    admin_tls_client_ca_file: str = field(
        default="",
        metadata={"help": "PEM CA: admin clients must present a certificate it signed (with --admin-tls-cert-file)"},
    )
    keys_file: str = field(
        default="",
        metadata={
            "help": "JSON file (mode 0600) keeping the API keys made with /admin/keys across restarts, for a node "
            "with the memory history backend (with postgres or redis they are kept there); every node writes "
            "all the cluster's keys to its own file. Empty: keys live in the cluster's memory only"
        },
    )
    client_cert_identity: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "with mutual TLS (--tls-client-ca-file): a verified client certificate is an identity when "
            "the request carries no key or token; KIND:VALUE=TENANT:ROLE (repeatable, first match wins), KIND "
            "cn (subject CN), dns or uri (a subject alternative name), e.g. uri:spiffe://prod/sa/api=billing:user"
        },
    )
    jwt_issuer: str = field(
        default="",
        metadata={
            "help": "accept JWT bearer tokens of this OIDC issuer (https URL; its keys by discovery, "
            "or --jwt-jwks-url); tokens must name it in 'iss'"
        },
    )
    jwt_jwks_url: str = field(default="", metadata={"help": "the issuer's JWKS (https), instead of discovery"})
    jwt_audience: tuple[str, ...] = field(
        default=(), metadata={"help": "an accepted 'aud' (repeatable); none given: 'aud' is not checked"}
    )
    jwt_algorithms: tuple[str, ...] = field(
        default=("RS256", "ES256"),
        metadata={"help": f"accepted signature algorithms, of {', '.join(KEY_TYPES)} (never none or HMAC)"},
    )
    jwt_leeway_s: float = field(default=30.0, metadata={"help": "clock skew allowed on exp and nbf"})
    jwt_tenant_claim: str = field(default="tenant", metadata={"help": "the claim naming the tenant (required)"})
    jwt_role_claim: str = field(
        default="role", metadata={"help": "the claim naming the role (a string or a list; the strongest wins)"}
    )
    jwt_default_role: Role = field(default="user", metadata={"help": "the role of a token without a role claim"})
    jwt_ca_file: str = field(
        default="", metadata={"help": "CA bundle (PEM) for the issuer's HTTPS; default: the system's"}
    )
    jwt_jwks_refresh_s: float = field(
        default=300.0, metadata={"help": "the issuer's keys are fetched again this often (and on an unknown kid)"}
    )

    def __post_init__(self) -> None:
        if self.admin_bind:
            host, _, port = self.admin_bind.rpartition(":")
            if not host or not port.isdigit() or int(port) > 65535:
                raise ValueError(f"admin_bind: expected host:port, got {self.admin_bind!r}")
        if bool(self.admin_tls_cert_file) != bool(self.admin_tls_key_file):
            raise ValueError("admin_tls_cert_file and admin_tls_key_file go together")
        if self.admin_tls_cert_file and not self.admin_bind:
            raise ValueError("admin_tls_cert_file: only for the admin API's own listener (admin_bind)")
        if self.admin_tls_client_ca_file and not self.admin_tls_cert_file:
            raise ValueError("admin_tls_client_ca_file needs admin_tls_cert_file and admin_tls_key_file")
        bad = [a for a in self.jwt_algorithms if a not in KEY_TYPES]
        if bad:
            raise ValueError(
                f"jwt_algorithms: {', '.join(bad)} not accepted (allowed: {', '.join(KEY_TYPES)}; none and HMAC never)"
            )
        for name in ("jwt_issuer", "jwt_jwks_url"):
            url = getattr(self, name)
            if url and not url.startswith("https://"):
                raise ValueError(f"{name}: must be an https:// URL, got {url!r}")
        if self.jwt_jwks_url and not self.jwt_issuer:
            raise ValueError("jwt_jwks_url needs jwt_issuer (tokens' 'iss' is always checked)")
        if self.jwt_leeway_s < 0 or self.jwt_jwks_refresh_s <= 0:
            raise ValueError("jwt_leeway_s must be >= 0 and jwt_jwks_refresh_s > 0")
        for rule in self.client_cert_rules:
            try:
                check_tenant(rule.tenant)
            except InvalidInput as exc:
                raise ValueError(f"client_cert_identity: tenant {rule.tenant!r}: {exc}") from None
        if self.auth_bootstrap_key and self.auth_bootstrap_key_file:
            raise ValueError("auth_bootstrap_key: give the key by file or by environment, not both")
        if self.auth_bootstrap_key:
            try:
                parse_key(self.auth_bootstrap_key)
            except KeyFormatError as exc:
                raise ValueError(f"auth_bootstrap_key: {exc}") from None

    @property
    def admin_addr(self) -> tuple[str, int] | None:
        if not self.admin_bind:
            return None
        host, _, port = self.admin_bind.rpartition(":")
        return host.strip("[]"), int(port)

    @property
    def client_cert_rules(self) -> tuple[CertRule, ...]:
        """Raises ValueError for a malformed rule."""
        return tuple(CertRule.parse(text) for text in self.client_cert_identity)

    @property
    def jwt_enabled(self) -> bool:
        return bool(self.jwt_issuer)

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
        if self.has_bootstrap or self.jwt_enabled or self.client_cert_identity:
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
