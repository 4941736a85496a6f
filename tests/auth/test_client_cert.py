"""Client certificates as identities (node/auth/client_cert.py): a real HTTPS node with mutual TLS and a test
CA maps a verified certificate's CN or URI name to a tenant and role; a presented key still wins; an unmapped
certificate is no identity."""

from __future__ import annotations

import contextlib
import dataclasses
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2 as httpx
import pytest

from node.app import RunningNode, run_node
from node.auth.client_cert import CertIdentities, CertRule
from node.auth.config import AuthConfig
from node.auth.keys import new_key
from node.config import HttpConfig
from node.sim.worker import SimWorker
from tests.http.conftest import fast_sim, node_config
from tests.mesh.tls_certs import CertAuthority, TlsFiles

SPIFFE = "spiffe://prod/ns/ops/sa/dashboard"
RULES = ("cn:billing-api=billing:user", f"uri:{SPIFFE}=ops:reader")


def test_rules_parse_and_match_exactly() -> None:
    assert CertRule.parse("uri:spiffe://a/b=t1:admin") == CertRule("uri", "spiffe://a/b", "t1", "admin")
    for bad in ("cn:x", "cn:x=t", "ip:1.2.3.4=t:user", "cn:x=t:root", "=t:user"):
        with pytest.raises(ValueError):
            CertRule.parse(bad)
    with pytest.raises(ValueError, match="tenant"):
        AuthConfig(client_cert_identity=("cn:x=a b:user",))
    certs = CertIdentities([CertRule.parse(r) for r in RULES])
    cert = {"subject": ((("commonName", "billing-api"),),), "subjectAltName": (("DNS", "billing-api.svc"),)}
    identity = certs.identity(cert)
    assert identity is not None and (identity.tenant, identity.role) == ("billing", "user")
    assert certs.identity({"subject": ((("commonName", "billing-api-2"),),)}) is None  # no prefix match
    assert certs.identity({"subjectAltName": (("URI", SPIFFE),)}) is not None
    assert certs.identity(None) is None


def _client(files: TlsFiles) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(files.ca))
    context.load_cert_chain(files.cert, files.key)
    return context


@contextlib.asynccontextmanager
async def _mtls_node(model_dir: Path, files: TlsFiles, admin: str) -> AsyncIterator[RunningNode]:
    async with contextlib.AsyncExitStack() as stack:
        sim = await stack.enter_async_context(SimWorker(fast_sim(model_dir)))
        base = node_config(model_dir, [sim.port])
        http = HttpConfig(
            port=0, tls_cert_file=str(files.cert), tls_key_file=str(files.key), tls_client_ca_file=str(files.ca)
        )
        auth = AuthConfig(auth_bootstrap_key=admin, client_cert_identity=RULES)
        yield await stack.enter_async_context(run_node(dataclasses.replace(base, http=http, auth=auth)))


async def test_a_verified_client_certificate_is_an_identity(llama3_model_dir: Path, tmp_path: Path) -> None:
    ca = CertAuthority(tmp_path, "ids")
    server = ca.issue("node", hosts=["127.0.0.1"])
    billing = ca.issue("billing-api")
    ops = ca.issue("dashboard", uris=[SPIFFE])
    stranger = ca.issue("stranger")
    admin, _ = new_key()
    async with _mtls_node(llama3_model_dir, server, admin) as node:

        async def status(files: TlsFiles, method: str, path: str, key: str | None = None) -> int:
            headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
            async with httpx.AsyncClient(verify=_client(files)) as client:
                return (await client.request(method, node.url + path, headers=headers)).status_code

        assert await status(billing, "GET", "/v1/models") == 200  # cn -> billing, user
        assert await status(billing, "GET", "/admin/keys") == 403
        assert await status(ops, "GET", "/metrics") == 200  # uri -> ops, reader
        assert await status(ops, "GET", "/v1/models") == 403
        assert await status(stranger, "GET", "/v1/models") == 401  # verified, but mapped by no rule
        # A presented key wins over the certificate, both ways.
        assert await status(billing, "GET", "/admin/keys", key=admin) == 200
        assert await status(billing, "GET", "/v1/models", key="smg-nothere-" + "x" * 43) == 401

        # The certificate's tenant is the request's: a stored response is billing's, not another tenant's.
        async with httpx.AsyncClient(verify=_client(billing)) as client:
            body = {"model": node.model.name, "input": "hi", "max_output_tokens": 4, "store": True}
            made = (await client.post(node.url + "/v1/responses", json=body)).json()
            assert (await client.get(f"{node.url}/v1/responses/{made['id']}")).status_code == 200
        async with httpx.AsyncClient(verify=_client(server)) as client:
            auth = {"Authorization": f"Bearer {admin}"}
            other = (
                await client.post(node.url + "/admin/keys", json={"tenant": "other", "role": "user"}, headers=auth)
            ).json()["key"]
            mine = (
                await client.post(node.url + "/admin/keys", json={"tenant": "billing", "role": "user"}, headers=auth)
            ).json()["key"]
            url = f"{node.url}/v1/responses/{made['id']}"
            assert (await client.get(url, headers={"Authorization": f"Bearer {other}"})).status_code == 404
            assert (await client.get(url, headers={"Authorization": f"Bearer {mine}"})).status_code == 200


def test_certificate_identities_need_mutual_tls(llama3_model_dir: Path) -> None:
    with pytest.raises(ValueError, match="mutual TLS"):
        dataclasses.replace(node_config(llama3_model_dir, []), auth=AuthConfig(client_cert_identity=RULES))
