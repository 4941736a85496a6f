"""JWT bearer tokens (OIDC): signature by the issuer's JWKS, an algorithm allow-list, exp/nbf/iss/aud with a
small leeway, and claims mapped to tenant and role. The check is pure (``verify_token``: keys and time come
in); ``JwksCache`` is the thin shell that fetches the keys over HTTPS.

Algorithm safety: the allow-list holds only asymmetric algorithms (node/auth/config.py refuses ``none`` and
every HMAC one), and a token's header ``alg`` must be in it *and* fit the type of the key its ``kid`` names,
so a token signed with HS256 using the RSA public key as the secret (the classic confusion) is refused before
any signature check.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

import jwt
from jwt import PyJWK

from node.auth.algorithms import KEY_TYPES
from node.auth.identity import Identity
from node.auth.keys import ROLES, Role
from storage.errors import InvalidInput
from storage.validation import check_tenant

#: A token longer than this is refused unparsed (bounds the work a header costs us).
MAX_TOKEN_BYTES: Final = 16 * 1024

JwtFailureReason = Literal["malformed", "algorithm", "unknown_kid", "signature", "expired", "claims"]


@dataclass(frozen=True, slots=True)
class JwtFailure:
    reason: JwtFailureReason
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Verified:
    identity: Identity
    #: Unix seconds (exp plus the leeway) after which the token is refused.
    expires_at: float


@dataclass(frozen=True, slots=True)
class ClaimRules:
    issuer: str
    audiences: tuple[str, ...]
    algorithms: tuple[str, ...]
    leeway_s: float
    tenant_claim: str
    role_claim: str
    default_role: Role


def looks_like_jwt(credential: str) -> bool:
    return credential.count(".") == 2 and len(credential) <= MAX_TOKEN_BYTES


def header_of(token: str) -> Mapping[str, object] | JwtFailure:
    try:
        return jwt.get_unverified_header(token)
    except jwt.PyJWTError as exc:
        return JwtFailure("malformed", str(exc))


def verify_token(token: str, keys: Mapping[str, PyJWK], rules: ClaimRules, *, now: float) -> Verified | JwtFailure:
    """The identity a token proves, or why not. ``keys``: the issuer's JWKS by kid."""
    if not looks_like_jwt(token):
        return JwtFailure("malformed")
    header = header_of(token)
    if isinstance(header, JwtFailure):
        return header
    alg, kid = header.get("alg"), header.get("kid")
    if not isinstance(alg, str) or alg not in rules.algorithms:
        return JwtFailure("algorithm", f"alg {alg!r} is not allowed")
    key = keys.get(kid) if isinstance(kid, str) else (next(iter(keys.values())) if len(keys) == 1 else None)
    if key is None:
        return JwtFailure("unknown_kid", f"kid {kid!r}")
    if KEY_TYPES.get(alg) != key.key_type:
        return JwtFailure("algorithm", f"alg {alg} does not fit the {key.key_type} key {kid!r}")
    try:
        claims = jwt.decode(
            token,
            key=key.key,
            algorithms=[alg],
            audience=list(rules.audiences) or None,
            issuer=rules.issuer or None,
            # exp and nbf are checked below against the injected clock, with the leeway.
            options={"require": ["exp"], "verify_aud": bool(rules.audiences), "verify_exp": False, "verify_nbf": False},
        )
    except jwt.InvalidSignatureError:
        return JwtFailure("signature")
    except (jwt.InvalidAudienceError, jwt.InvalidIssuerError, jwt.MissingRequiredClaimError) as exc:
        return JwtFailure("claims", str(exc))
    except jwt.PyJWTError as exc:
        return JwtFailure("malformed", str(exc))
    exp, nbf = claims.get("exp"), claims.get("nbf", 0)
    if not isinstance(exp, int | float) or isinstance(exp, bool) or not isinstance(nbf, int | float):
        return JwtFailure("claims", "exp/nbf must be numbers")
    if now >= exp + rules.leeway_s:
        return JwtFailure("expired")
    if now < nbf - rules.leeway_s:
        return JwtFailure("expired", "not yet valid (nbf)")
    identity = _identity(claims, rules)
    return identity if isinstance(identity, JwtFailure) else Verified(identity, float(exp) + rules.leeway_s)


def _identity(claims: Mapping[str, object], rules: ClaimRules) -> Identity | JwtFailure:
    tenant = claims.get(rules.tenant_claim)
    if not isinstance(tenant, str):
        return JwtFailure("claims", f"no {rules.tenant_claim!r} claim")
    try:
        check_tenant(tenant)
    except InvalidInput as exc:
        return JwtFailure("claims", f"{rules.tenant_claim!r}: {exc}")
    raw = claims.get(rules.role_claim)
    granted = [raw] if isinstance(raw, str) else [r for r in raw if isinstance(r, str)] if isinstance(raw, list) else []
    # The strongest role the token names, in ROLES' order (admin first); none named: the default.
    role = next((r for r in ROLES if r in granted), None)
    if raw is not None and role is None:
        return JwtFailure("claims", f"{rules.role_claim!r} names no role of {', '.join(ROLES)}")
    subject = claims.get("sub")
    return Identity(
        subject=f"jwt:{subject if isinstance(subject, str) else '?'}"[:300],
        tenant=tenant,
        role=role or rules.default_role,  # type: ignore[arg-type]  # an element of ROLES
    )
