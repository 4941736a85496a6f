"""JWT bearer tokens against a real local HTTPS identity provider (test CA): discovery, JWKS, rotation, and
every token that must be refused."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import hmac
import json
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jwt
import openai
import pytest
import pytest_asyncio
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from openai import AsyncOpenAI

from node.app import run_node
from node.auth.authenticator import AuthFailure
from node.auth.config import AuthConfig
from node.auth.identity import Identity
from node.auth.jwks import JwksCache
from node.auth.jwt_auth import JwtAuthenticator
from node.auth.jwt_verifier import ClaimRules
from node.sim.worker import SimWorker
from tests.http.conftest import fast_sim, node_config
from tests.mesh.tls_certs import CertAuthority

AUDIENCE = "smg-node"


@dataclasses.dataclass
class Idp:
    """A local OIDC issuer over HTTPS: its JWKS is ``published`` (mutable: rotate by editing it)."""

    issuer: str
    ca_file: Path
    keys: dict[str, Any]
    published: list[str]

    def jwks(self) -> dict[str, Any]:
        out = []
        for kid in self.published:
            public = self.keys[kid].public_key()
            algo = jwt.algorithms.RSAAlgorithm if isinstance(public, rsa.RSAPublicKey) else jwt.algorithms.ECAlgorithm
            jwk = json.loads(algo.to_jwk(public))
            out.append({**jwk, "kid": kid, "use": "sig"})
        return {"keys": out}

    def token(self, kid: str = "k1", alg: str = "RS256", **claims: Any) -> str:
        now = int(time.time())
        body = {"iss": self.issuer, "aud": AUDIENCE, "sub": "alice", "tenant": "acme", "exp": now + 300, **claims}
        body = {k: v for k, v in body.items() if v is not None}
        return jwt.encode(body, self.keys[kid], algorithm=alg, headers={"kid": kid})


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@pytest_asyncio.fixture
async def idp(tmp_path: Path) -> AsyncIterator[Idp]:
    ca = CertAuthority(tmp_path, "idp")
    files = ca.issue("idp", hosts=["127.0.0.1"])
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(files.cert, files.key)
    keys = {
        "k1": rsa.generate_private_key(public_exponent=65537, key_size=2048),
        "k2": rsa.generate_private_key(public_exponent=65537, key_size=2048),
        "e1": ec.generate_private_key(ec.SECP256R1()),
    }
    state = Idp(issuer="", ca_file=files.ca, keys=keys, published=["k1", "e1"])

    async def discovery(_request: web.Request) -> web.Response:
        return web.json_response({"issuer": state.issuer, "jwks_uri": f"{state.issuer}/jwks"})

    async def jwks(_request: web.Request) -> web.Response:
        return web.json_response(state.jwks())

    app = web.Application()
    app.router.add_get("/.well-known/openid-configuration", discovery)
    app.router.add_get("/jwks", jwks)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    state.issuer = f"https://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield state
    finally:
        await runner.cleanup()


def _authenticator(idp: Idp, now: list[float]) -> JwtAuthenticator:
    cache = JwksCache(
        issuer=idp.issuer,
        jwks_url="",
        ssl_context=ssl.create_default_context(cafile=str(idp.ca_file)),
        refresh_s=300,
        clock=lambda: now[0],
    )
    rules = ClaimRules(
        issuer=idp.issuer,
        audiences=(AUDIENCE,),
        algorithms=("RS256", "ES256"),
        leeway_s=5,
        tenant_claim="tenant",
        role_claim="role",
        default_role="user",
    )
    return JwtAuthenticator(cache, rules)


async def test_valid_tokens_become_identities(idp: Idp) -> None:
    auth = _authenticator(idp, [0.0])
    identity = await auth.authenticate(idp.token(role=["reader", "admin"]))
    assert identity == Identity(subject="jwt:alice", tenant="acme", role="admin")
    es = await auth.authenticate(idp.token(kid="e1", alg="ES256", tenant="beta"))
    assert isinstance(es, Identity) and (es.tenant, es.role) == ("beta", "user")
    assert auth.cache.fetches == 1  # discovery + JWKS once, then cached


async def test_every_bad_token_is_refused(idp: Idp) -> None:
    auth = _authenticator(idp, [0.0])
    now = int(time.time())
    claims = {"iss": idp.issuer, "aud": AUDIENCE, "sub": "x", "tenant": "acme", "exp": now + 300}
    header = {"alg": "none", "typ": "JWT", "kid": "k1"}
    alg_none = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}."
    # HS256 "signed" with the RSA public key as the HMAC secret: the algorithm-confusion attack.
    public_pem = (
        idp.keys["k1"]
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    signing_input = f"{_b64(json.dumps({'alg': 'HS256', 'kid': 'k1'}).encode())}.{_b64(json.dumps(claims).encode())}"
    forged = signing_input + "." + _b64(hmac.new(public_pem, signing_input.encode(), hashlib.sha256).digest())
    # RS256 header on the EC key's kid: the alg must fit the key.
    wrong_type = idp.token(kid="e1", alg="ES256").split(".")
    wrong_type[0] = _b64(json.dumps({"alg": "RS256", "kid": "e1"}).encode())
    tampered = idp.token().split(".")
    tampered[1] = _b64(json.dumps({**claims, "tenant": "other"}).encode())
    refused = {
        "alg none": alg_none,
        "HS256 with the RSA public key": forged,
        "alg not fitting the key": ".".join(wrong_type),
        "tampered claims": ".".join(tampered),
        "expired": idp.token(exp=now - 60),
        "not yet valid": idp.token(nbf=now + 600),
        "wrong issuer": idp.token(iss="https://evil.example"),
        "wrong audience": idp.token(aud="someone-else"),
        "no exp": idp.token(exp=None),
        "no tenant": idp.token(tenant=None),
        "unknown role": idp.token(role="root"),
        "signed by an unpublished key": idp.token(kid="k2"),
        "garbage": "a.b.c",
    }
    for what, token in refused.items():
        result = await auth.authenticate(token)
        assert isinstance(result, AuthFailure), what
    assert isinstance(await auth.authenticate(idp.token(exp=now - 2)), Identity)  # within the 5 s leeway


async def test_an_unknown_kid_refetches_the_jwks_after_a_rotation_at_most_every_10_s(idp: Idp) -> None:
    now = [1000.0]
    auth = _authenticator(idp, now)
    assert isinstance(await auth.authenticate(idp.token()), Identity)
    idp.published = ["k2"]  # the issuer rotates: k1 retired, k2 new
    now[0] += 1
    assert isinstance(await auth.authenticate(idp.token(kid="k2")), AuthFailure)  # too soon to refetch
    assert auth.cache.fetches == 1
    now[0] += 10
    assert isinstance(await auth.authenticate(idp.token(kid="k2")), Identity)
    assert auth.cache.fetches == 2
    # A new token of the retired key is refused (one verified before stays trusted up to VERIFIED_TTL_S).
    assert isinstance(await auth.authenticate(idp.token(kid="k1", sub="bob")), AuthFailure)


def test_config_refuses_none_hmac_and_plain_http() -> None:
    for algs in (("none",), ("HS256",), ("RS256", "HS512")):
        with pytest.raises(ValueError, match="never"):
            AuthConfig(jwt_issuer="https://idp", jwt_algorithms=algs)
    with pytest.raises(ValueError, match="https"):
        AuthConfig(jwt_issuer="http://idp")
    assert AuthConfig(jwt_issuer="https://idp").enforced("0.0.0.0")


async def test_a_node_accepts_the_issuers_tokens_with_the_openai_client(idp: Idp, llama3_model_dir: Path) -> None:
    async with contextlib.AsyncExitStack() as stack:
        sim = await stack.enter_async_context(SimWorker(fast_sim(llama3_model_dir)))
        auth = AuthConfig(jwt_issuer=idp.issuer, jwt_audience=(AUDIENCE,), jwt_ca_file=str(idp.ca_file))
        node = await stack.enter_async_context(
            run_node(dataclasses.replace(node_config(llama3_model_dir, [sim.port]), auth=auth))
        )
        async with AsyncOpenAI(base_url=f"{node.url}/v1", api_key=idp.token(), max_retries=0) as client:
            models = await client.models.list()
            assert models.data
        async with AsyncOpenAI(base_url=f"{node.url}/v1", api_key=idp.token(exp=1), max_retries=0) as client:
            with pytest.raises(openai.AuthenticationError, match="expired"):
                await client.models.list()
