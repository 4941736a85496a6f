"""Authentication on a real node (real sockets, simulated workers): API keys, roles, tenants, the admin
API and CLI, the bootstrap key and the safe default."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import pytest_asyncio
from openai import AsyncOpenAI

from node.app import RunningNode, run_node
from node.auth.config import AuthConfig
from node.auth.keys import new_key
from node.auth.limits import WINDOW_S
from node.cluster.config import ClusterConfig
from node.sim.worker import SimWorker
from tests.http.conftest import fast_sim, node_config
from tests.procs import REPO, SMG_NODE

BOOTSTRAP, _ = new_key()
#: Every admin route, with a body that would be valid, so a refusal is the auth layer's and not a 400.
ADMIN_ROUTES: list[tuple[str, str, dict[str, Any] | None]] = [
    ("POST", "/workers", {"url": "grpc://127.0.0.1:1"}),
    ("DELETE", "/workers/w-000000000000", None),
    ("POST", "/admin/keys", {"tenant": "x", "role": "admin"}),
    ("GET", "/admin/keys", None),
    ("GET", "/admin/keys/abcdefgh", None),
    ("DELETE", "/admin/keys/abcdefgh", None),
    ("POST", "/mesh/join", {"peers": ["127.0.0.1:9"]}),
]


@dataclasses.dataclass
class Secured:
    node: RunningNode
    session: aiohttp.ClientSession
    sim: SimWorker | None = None

    async def call(self, method: str, path: str, key: str | None, body: Any = None) -> tuple[int, Any, Any]:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        async with self.session.request(method, self.node.url + path, json=body, headers=headers) as r:
            payload = await r.json() if r.content_type == "application/json" else await r.text()
            return r.status, payload, r.headers

    async def create_key(self, **body: Any) -> dict[str, Any]:
        status, created, _ = await self.call("POST", "/admin/keys", BOOTSTRAP, body)
        assert status == 201, created
        return dict(created)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def secured(llama3_model_dir: Path) -> AsyncIterator[Secured]:
    async with contextlib.AsyncExitStack() as stack:
        sim = await stack.enter_async_context(SimWorker(fast_sim(llama3_model_dir)))
        config = dataclasses.replace(
            node_config(llama3_model_dir, [sim.port]),
            auth=AuthConfig(auth_bootstrap_key=BOOTSTRAP),
            cluster=ClusterConfig(mesh_bind="127.0.0.1:0", mesh_profile="local"),
        )
        node = await stack.enter_async_context(run_node(config))
        session = await stack.enter_async_context(aiohttp.ClientSession())
        yield Secured(node, session, sim)


pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_every_admin_route_is_401_without_credentials_and_403_for_a_user(secured: Secured) -> None:
    user = (await secured.create_key(tenant="acme", role="user"))["key"]
    reader = (await secured.create_key(tenant="acme", role="reader"))["key"]
    for method, path, body in ADMIN_ROUTES:
        status, payload, headers = await secured.call(method, path, None, body)
        assert status == 401, (method, path, payload)
        assert payload["error"]["code"] == "invalid_api_key" and headers["WWW-Authenticate"].startswith("Bearer")
        status, payload, _ = await secured.call(method, path, "smg-abcdefgh-" + "x" * 43, body)
        assert status == 401, (method, path, payload)
        for key in (user, reader):
            status, payload, _ = await secured.call(method, path, key, body)
            assert status == 403 and payload["error"]["code"] == "insufficient_permissions", (method, path)
    # The rogue-cluster join of issue 14: nothing joined.
    assert secured.node.mesh is not None and len(secured.node.mesh.members()) == 1
    # Readers see status, not inference; users see inference, not status; /health stays open.
    assert (await secured.call("GET", "/metrics", reader))[0] == 200
    assert (await secured.call("GET", "/workers", reader))[0] == 200
    assert (await secured.call("GET", "/metrics", user))[0] == 403
    assert (await secured.call("GET", "/v1/models", reader))[0] == 403
    assert (await secured.call("GET", "/v1/models", user))[0] == 200
    assert (await secured.call("GET", "/health", None))[0] == 200
    metrics = (await secured.call("GET", "/metrics", BOOTSTRAP))[1]
    assert 'smg_node_auth_failures_total{reason="missing"}' in metrics


async def test_keys_work_with_the_openai_client_and_stop_when_revoked(secured: Secured) -> None:
    created = await secured.create_key(tenant="acme", role="user", name="ci")
    key, key_id = created["key"], created["id"]
    status, listed, _ = await secured.call("GET", "/admin/keys", BOOTSTRAP)
    assert status == 200 and any(k["id"] == key_id for k in listed["data"])
    assert key.split("-", 2)[2] not in str(listed)  # the secret is never shown again
    assert (await secured.call("GET", f"/admin/keys/{key_id}", BOOTSTRAP))[1]["tenant"] == "acme"
    model = secured.node.model.name
    async with AsyncOpenAI(base_url=f"{secured.node.url}/v1", api_key=key, max_retries=0) as client:
        done = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert done.choices[0].message.content is not None
        # Anthropic's header works too.
        async with secured.session.get(secured.node.url + "/v1/models", headers={"x-api-key": key}) as r:
            assert r.status == 200
        status, revoked, _ = await secured.call("DELETE", f"/admin/keys/{key_id}", BOOTSTRAP)
        assert status == 200 and revoked["revoked_at"] is not None
        with pytest.raises(openai.AuthenticationError):
            await client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
    async with AsyncOpenAI(base_url=f"{secured.node.url}/v1", api_key="sk-wrong", max_retries=0) as client:
        with pytest.raises(openai.AuthenticationError):
            await client.models.list()


async def test_the_tenant_comes_from_the_key(secured: Secured) -> None:
    a = (await secured.create_key(tenant="tenant-a", role="user"))["key"]
    b = (await secured.create_key(tenant="tenant-b", role="user"))["key"]
    model = secured.node.model.name
    body = {"model": model, "input": "hello", "max_output_tokens": 4}
    status, stored, _ = await secured.call("POST", "/v1/responses", a, body)
    assert status == 200, stored
    rid = stored["id"]
    assert (await secured.call("GET", f"/v1/responses/{rid}", a))[0] == 200
    # B names A's response, even with A's tenant in the header: not found, not deleted.
    headers = {"Authorization": f"Bearer {b}", "X-SMG-Tenant": "tenant-a"}
    async with secured.session.get(f"{secured.node.url}/v1/responses/{rid}", headers=headers) as r:
        assert r.status == 404
    assert (await secured.call("DELETE", f"/v1/responses/{rid}", b))[0] == 404
    assert (await secured.call("GET", f"/v1/responses/{rid}", a))[0] == 200


async def test_admin_api_refuses_bad_input(secured: Secured) -> None:
    for body, param in (
        ({"role": "root"}, "role"),
        ({"tenant": "a b"}, "tenant"),
        ({"expires_in_s": -1}, "expires_in_s"),
        ({"limits": {"requests_per_minute": -5}}, "limits.requests_per_minute"),
    ):
        status, payload, _ = await secured.call("POST", "/admin/keys", BOOTSTRAP, body)
        assert status == 400 and payload["error"]["param"] == param, (body, payload)
    assert (await secured.call("DELETE", "/admin/keys/zzzzzzzz", BOOTSTRAP))[0] == 404


async def test_cli_keys_create_list_revoke(secured: Secured, tmp_path: Path) -> None:
    key_file = tmp_path / "admin.key"
    key_file.write_text(BOOTSTRAP + "\n")

    async def cli(*args: str) -> str:
        proc = await asyncio.create_subprocess_exec(
            *SMG_NODE, "keys", *args, "--node", secured.node.url, "--api-key-file", str(key_file),
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()
        return out.decode()

    key = (await cli("create", "--tenant", "cli-t", "--role", "reader", "--rpm", "10")).strip()
    key_id = key.split("-")[1]
    listing = await cli("list")
    assert key_id in listing and "cli-t" in listing and key.split("-", 2)[2] not in listing
    assert (await secured.call("GET", "/metrics", key))[0] == 200
    assert f"revoked {key_id}" in await cli("revoke", key_id)
    assert (await secured.call("GET", "/metrics", key))[0] == 401


async def _clear_of_a_window_boundary(margin_s: float = 5.0) -> None:
    """Windows are fixed minutes: start a counting test where the next boundary is at least ``margin_s`` off."""
    left = WINDOW_S - time.time() % WINDOW_S
    if left < margin_s:
        await asyncio.sleep(left + 0.05)


async def test_rate_limits_answer_429_with_openai_headers(secured: Secured) -> None:
    key = (await secured.create_key(tenant="rl", role="user", limits={"requests_per_minute": 3}))["key"]
    await _clear_of_a_window_boundary()
    seen = []
    for _ in range(3):
        status, _, headers = await secured.call("GET", "/v1/models", key)
        assert status == 200 and headers["x-ratelimit-limit-requests"] == "3"
        seen.append(int(headers["x-ratelimit-remaining-requests"]))
    assert seen == [2, 1, 0]
    status, payload, headers = await secured.call("GET", "/v1/models", key)
    assert status == 429 and payload["error"]["code"] == "rate_limit_exceeded", payload
    assert 1 <= int(headers["Retry-After"]) <= 60 and headers["x-ratelimit-remaining-requests"] == "0"
    # The openai client reads the 429 as a RateLimitError.
    async with AsyncOpenAI(base_url=f"{secured.node.url}/v1", api_key=key, max_retries=0) as client:
        with pytest.raises(openai.RateLimitError):
            await client.models.list()


async def test_streams_carry_the_headers_and_concurrency_is_limited(secured: Secured) -> None:
    key = (await secured.create_key(tenant="cc", role="user", limits={"concurrent": 1, "tokens_per_minute": 10**6}))[
        "key"
    ]
    body = {
        "model": secured.node.model.name,
        "messages": [{"role": "user", "content": "tell me a long story"}],
        "max_tokens": 300,
        "ignore_eos": True,
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {key}"}
    url = secured.node.url + "/v1/chat/completions"
    async with secured.session.post(url, json=body, headers=headers) as first:
        assert first.status == 200 and first.headers["x-ratelimit-limit-tokens"] == "1000000"
        await first.content.readline()  # the stream is open: one request in flight
        async with secured.session.post(url, json=body, headers=headers) as second:
            assert second.status == 429
            assert "concurrent" in (await second.json())["error"]["message"]
        await first.read()
    # Finished: the slot is free again, and the tokens it used are charged.
    async with secured.session.post(url, json={**body, "max_tokens": 2}, headers=headers) as third:
        assert third.status == 200
        used = 10**6 - int(third.headers["x-ratelimit-remaining-tokens"])
        assert used >= 300, used
        await third.read()


async def test_tenant_limits_through_the_admin_api(secured: Secured) -> None:
    put = {"requests_per_minute": 2}
    status, body, _ = await secured.call("PUT", "/admin/tenants/shared-t/limits", BOOTSTRAP, put)
    assert status == 200 and body["limits"]["requests_per_minute"] == 2
    assert any(t["tenant"] == "shared-t" for t in (await secured.call("GET", "/admin/tenants", BOOTSTRAP))[1]["data"])
    user = (await secured.create_key(tenant="shared-t", role="user"))["key"]
    assert (await secured.call("PUT", "/admin/tenants/shared-t/limits", user, put))[0] == 403
    other = (await secured.create_key(tenant="shared-t", role="user"))["key"]
    await _clear_of_a_window_boundary()
    statuses = [(await secured.call("GET", "/v1/models", k))[0] for k in (user, other, user, other)]
    assert statuses == [200, 200, 429, 429]  # two keys, one tenant budget
    await secured.call("PUT", "/admin/tenants/shared-t/limits", BOOTSTRAP, {})
    assert (await secured.call("GET", "/v1/models", user))[0] == 200  # cleared


async def test_the_admin_api_on_its_own_listener(llama3_model_dir: Path) -> None:
    async with contextlib.AsyncExitStack() as stack:
        sim = await stack.enter_async_context(SimWorker(fast_sim(llama3_model_dir)))
        auth = AuthConfig(auth_bootstrap_key=BOOTSTRAP, admin_bind="127.0.0.1:0")
        node = await stack.enter_async_context(
            run_node(dataclasses.replace(node_config(llama3_model_dir, [sim.port]), auth=auth))
        )
        assert node.admin_url is not None and node.admin_url != node.url
        admin = Secured(
            dataclasses.replace(node, url=node.admin_url), await stack.enter_async_context(aiohttp.ClientSession())
        )
        public = Secured(node, admin.session)
        created = await admin.create_key(tenant="sep", role="user")
        assert (await public.call("POST", "/admin/keys", BOOTSTRAP, {"role": "user"}))[0] == 404
        assert (await public.call("GET", "/workers", BOOTSTRAP))[0] == 404
        assert (await admin.call("GET", "/admin/keys", None))[0] == 401  # credentials needed there too
        assert (await admin.call("GET", "/workers", BOOTSTRAP))[0] == 200
        assert (await public.call("GET", "/v1/models", created["key"]))[0] == 200
        assert (await admin.call("GET", "/v1/models", created["key"]))[0] == 404
        # The status page lives here, and its /metrics link is relative: both listeners serve /metrics.
        assert (await admin.call("GET", "/status.json", BOOTSTRAP))[0] == 200
        assert (await admin.call("GET", "/metrics", BOOTSTRAP))[0] == 200
        assert (await admin.call("GET", "/metrics", None))[0] == 401
        assert (await public.call("GET", "/metrics", BOOTSTRAP))[0] == 200


async def test_a_node_requiring_keys_says_when_they_are_not_kept_durably(
    llama3_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Keys only in the gossiped table are gone when every node stops: the operator is told at start, and not
    when a store keeps them (here --keys-file; Redis and Postgres are the same `durable` store)."""
    async with SimWorker(fast_sim(llama3_model_dir)) as sim:
        base = dataclasses.replace(
            node_config(llama3_model_dir, [sim.port]), auth=AuthConfig(auth_bootstrap_key=BOOTSTRAP)
        )
        with caplog.at_level(logging.WARNING, logger="node.app"):
            async with run_node(base):
                pass
            assert "in the cluster's memory only" in caplog.text
            caplog.clear()
            kept = AuthConfig(auth_bootstrap_key=BOOTSTRAP, keys_file=str(tmp_path / "keys.json"))
            async with run_node(dataclasses.replace(base, auth=kept)):
                pass
            assert "memory only" not in caplog.text


async def test_prompt_plus_output_budget_is_reserved_at_admission_and_settled_to_actual_usage(
    secured: Secured,
) -> None:
    """Tokens per minute count the prompt and the requested output budget before any worker sees the
    request; when it ends, the charge is its actual usage (the unused budget refunded)."""
    key = (await secured.create_key(tenant="tr", role="user", limits={"tokens_per_minute": 1000}))["key"]
    headers = {"Authorization": f"Bearer {key}"}
    url = secured.node.url + "/v1/chat/completions"
    body = {"model": secured.node.model.name, "messages": [{"role": "user", "content": "hello there"}]}
    await _clear_of_a_window_boundary()
    seen_before = _worker_requests(secured)
    async with secured.session.post(url, json={**body, "max_tokens": 1000}, headers=headers) as refused:
        assert refused.status == 429, await refused.text()
        error = (await refused.json())["error"]
        assert error["code"] == "rate_limit_exceeded" and "tokens per minute" in error["message"]
        assert refused.headers["x-ratelimit-remaining-tokens"] == "1000" and "Retry-After" in refused.headers
    assert _worker_requests(secured) == seen_before  # refused before Dispatch
    async with secured.session.post(url, json={**body, "max_tokens": 200}, headers=headers) as ok:
        assert ok.status == 200, await ok.text()
        usage = (await ok.json())["usage"]
        reserved = usage["prompt_tokens"] + 200
        assert ok.headers["x-ratelimit-remaining-tokens"] == str(1000 - reserved)
    status, _, after = await secured.call("GET", "/v1/models", key)
    assert status == 200 and int(after["x-ratelimit-remaining-tokens"]) == 1000 - usage["total_tokens"]


def _worker_requests(secured: Secured) -> int:
    assert secured.sim is not None
    engine = secured.sim.engine
    return engine.completed_requests + engine.cancelled_requests + engine.active_requests


async def test_anthropic_messages_refusals_speak_anthropics_error_envelope(secured: Secured) -> None:
    """/v1/messages answers 401/403/429 as Anthropic does ({"type":"error","error":{"type",...}}), with the
    rate limit's headers, so Anthropic's clients read them as their own errors."""
    body = {"model": secured.node.model.name, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    reader = (await secured.create_key(tenant="an", role="reader"))["key"]
    limited = (await secured.create_key(tenant="an", role="user", limits={"requests_per_minute": 1}))["key"]
    status, payload, _ = await secured.call("POST", "/v1/messages", None, body)
    assert status == 401 and payload["type"] == "error", payload
    assert payload["error"]["type"] == "authentication_error" and payload["error"]["message"]
    status, payload, _ = await secured.call("POST", "/v1/messages", reader, body)
    assert status == 403 and payload["type"] == "error" and payload["error"]["type"] == "permission_error", payload
    await _clear_of_a_window_boundary()
    assert (await secured.call("POST", "/v1/messages", limited, body))[0] == 200
    status, payload, headers = await secured.call("POST", "/v1/messages", limited, body)
    assert status == 429 and payload["type"] == "error" and payload["error"]["type"] == "rate_limit_error", payload
    assert "Retry-After" in headers and headers["x-ratelimit-remaining-requests"] == "0"


async def test_a_stream_the_client_abandons_releases_its_reservation(secured: Secured) -> None:
    """An aborted request's unused reservation goes back to the window: only what it used stays charged."""
    key = (await secured.create_key(tenant="ta", role="user", limits={"tokens_per_minute": 2000}))["key"]
    headers = {"Authorization": f"Bearer {key}"}
    body = {
        "model": secured.node.model.name,
        "messages": [{"role": "user", "content": "tell me a long story"}],
        "max_tokens": 1500,
        "ignore_eos": True,
        "stream": True,
    }
    await _clear_of_a_window_boundary()
    async with secured.session.post(secured.node.url + "/v1/chat/completions", json=body, headers=headers) as r:
        assert r.status == 200 and int(r.headers["x-ratelimit-remaining-tokens"]) < 500  # reserved
        await r.content.readline()
        r.close()  # the client goes away mid-stream
    deadline = time.monotonic() + 5
    while True:
        remaining = int((await secured.call("GET", "/v1/models", key))[2]["x-ratelimit-remaining-tokens"])
        if remaining > 500 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    assert 500 < remaining < 2000, remaining  # refunded, but the prompt it used is charged
