"""The authentication middleware: the credential of every request to an identity, the route's roles checked.

Credentials (API keys, or JWTs when an issuer is configured) come as ``Authorization: Bearer <key>``
(OpenAI's clients) or ``x-api-key: <key>`` (Anthropic's). A request with neither, on a connection whose
client certificate the TLS handshake verified (mutual TLS), runs as the certificate's identity when a
configured rule maps it (node/auth/client_cert.py); a presented key or token always wins over it.
Missing or bad credentials are 401 (with ``WWW-Authenticate: Bearer``), a valid identity without the route's
role is 403; both raise the gateway's errors, which the error middleware renders in the API's envelope.
The identity rides on the request (``IDENTITY``) for the tenant (node/http/tenancy.py) and the limits.
Absent when auth is off: no middleware, every request as before.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final

from aiohttp import web
from aiohttp.typedefs import Middleware

from node.auth.access import allowed_roles
from node.auth.authenticator import ApiKeyAuthenticator, AuthFailure
from node.auth.client_cert import CertIdentities, PeerCert
from node.auth.identity import Identity
from node.errors import Forbidden, Unauthorized

if TYPE_CHECKING:  # PyJWT and cryptography load only when JWTs are accepted (node.app)
    from node.auth.jwt_auth import JwtAuthenticator

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

#: The verified identity of a request (absent when auth is off).
IDENTITY: Final = web.RequestKey("smg_identity", Identity)
MALFORMED: Final = AuthFailure("malformed")
_CHALLENGE: Final = {"WWW-Authenticate": 'Bearer realm="smg-node"'}


def credential_of(request: web.Request) -> str | None:
    """The presented credential: the Bearer token, else x-api-key; "" for an Authorization header of
    another scheme (refused, never ignored in favour of x-api-key)."""
    header = request.headers.get("Authorization")
    if header is not None:
        scheme, _, token = header.strip().partition(" ")
        return token.strip() if scheme.lower() == "bearer" else ""
    return request.headers.get("x-api-key")


def auth_middleware(
    authenticator: ApiKeyAuthenticator,
    *,
    jwt: JwtAuthenticator | None = None,
    certs: CertIdentities | None = None,
    on_failure: Callable[[AuthFailure], None] = lambda _f: None,
) -> Middleware:
    """API keys always; with ``jwt``, a bearer credential that is not a key of ours but looks like a JWT is
    checked as one."""

    @web.middleware
    async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
        roles = allowed_roles(request.method, request.path)
        if roles is None:
            return await handler(request)
        credential = credential_of(request)
        result: Identity | AuthFailure | None = None
        if credential is None and certs:
            result = certs.identity(_peer_cert(request))
        if result is None:
            result = authenticator.authenticate(credential)
        if jwt is not None and result == MALFORMED and credential and jwt.accepts(credential):
            result = await jwt.authenticate(credential)
        if isinstance(result, AuthFailure):
            on_failure(result)
            raise Unauthorized(result.message, headers=_CHALLENGE)
        if result.role not in roles:
            raise Forbidden(
                f"Your API key's role '{result.role}' may not call {request.method} {request.path}; "
                f"it needs one of: {', '.join(sorted(roles))}."
            )
        request[IDENTITY] = result
        return await handler(request)

    return authenticate


def _peer_cert(request: web.Request) -> PeerCert | None:
    """The client certificate the handshake verified (None on plain HTTP or without one)."""
    transport = request.transport
    cert = transport.get_extra_info("peercert") if transport is not None else None
    return cert if isinstance(cert, dict) else None
