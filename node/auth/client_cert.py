"""Client certificates as identities (mutual TLS): a verified certificate's subject CN, or one of its DNS or
URI subject alternative names, mapped to a tenant and a role by configuration (a pure core: the certificate
comes in as the dict ``ssl.SSLSocket.getpeercert()`` returns).

Only a certificate the TLS handshake verified against ``--tls-client-ca-file`` ever reaches this (the
listener requires one when that CA is set), so a match is an authenticated identity. A rule reads
``KIND:VALUE=TENANT:ROLE`` with KIND one of ``cn``, ``dns``, ``uri``, e.g.
``uri:spiffe://prod/ns/billing/sa/api=billing:user``; values compare exactly (no wildcards: a pattern is
one more way to grant too much). Rules are tried in order; the first that matches wins. A certificate that
matches no rule is no identity (the request needs a key or token as before).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal, get_args

from node.auth.identity import Identity
from node.auth.keys import ROLES, Role

CertField = Literal["cn", "dns", "uri"]
CERT_FIELDS: Final[tuple[str, ...]] = get_args(CertField)
#: getpeercert()'s names of the fields: subject attribute, subjectAltName types.
_SAN_TYPES: Final = {"dns": "DNS", "uri": "URI"}


@dataclass(frozen=True, slots=True)
class CertRule:
    field: CertField
    value: str
    tenant: str
    role: Role

    @classmethod
    def parse(cls, text: str) -> CertRule:
        """Raises ValueError naming what is wrong (the rule's own text is config, not a secret)."""
        match_part, sep, grant = text.rpartition("=")
        kind, _, value = match_part.partition(":")
        tenant, _, role = grant.partition(":")
        if not sep or kind not in CERT_FIELDS or not value or not tenant or not role:
            raise ValueError(f"client cert rule {text!r}: expected KIND:VALUE=TENANT:ROLE, KIND one of {CERT_FIELDS}")
        if role not in ROLES:
            raise ValueError(f"client cert rule {text!r}: role must be one of {', '.join(ROLES)}")
        return cls(kind, value, tenant, role)  # type: ignore[arg-type]  # both checked above


PeerCert = Mapping[str, object]


def cert_names(cert: PeerCert) -> set[tuple[str, str]]:
    """(field, value) pairs a rule can match: the subject's CNs and the DNS/URI alternative names."""
    names: set[tuple[str, str]] = set()
    subject = cert.get("subject")
    if isinstance(subject, tuple):
        for rdn in subject:
            for attr in rdn if isinstance(rdn, tuple) else ():
                if isinstance(attr, tuple) and len(attr) == 2 and attr[0] == "commonName":
                    names.add(("cn", str(attr[1])))
    sans = cert.get("subjectAltName")
    if isinstance(sans, tuple):
        for san in sans:
            if isinstance(san, tuple) and len(san) == 2:
                for field, kind in _SAN_TYPES.items():
                    if san[0] == kind:
                        names.add((field, str(san[1])))
    return names


class CertIdentities:
    """The configured rules; ``identity`` maps a verified certificate."""

    def __init__(self, rules: Sequence[CertRule]) -> None:
        self._rules = tuple(rules)

    def __bool__(self) -> bool:
        return bool(self._rules)

    def identity(self, cert: PeerCert | None) -> Identity | None:
        if not cert or not self._rules:
            return None
        names = cert_names(cert)
        for rule in self._rules:
            if (rule.field, rule.value) in names:
                return Identity(subject=f"cert:{rule.field}:{rule.value}", tenant=rule.tenant, role=rule.role)
        return None
