"""Responses/Conversations failure paths: bad input, unknown ids, tenants, and a history store outage."""

from __future__ import annotations

import asyncio
import contextlib
import io
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import pytest_asyncio

from node.http.history import CONTENDED_MESSAGE, OUTAGE_HOLD_S, PROBE_AFTER_S
from node.http.tenancy import DEFAULT_TENANT, TENANT_HEADER, ApiConfig
from storage.config import StorageConfig
from tests.http.conftest import Cluster, start_cluster
from tests.storage.conftest import PG_PORT, PG_URL, TcpProxy, drop_tables, port_open
from tests.storage.contention import churned_conversation

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster(llama3_model_dir: Path) -> AsyncIterator[Cluster]:
    async with start_cluster(llama3_model_dir, workers=1, api=ApiConfig(trust_tenant_header=True)) as c:
        yield c


async def _request(
    cluster: Cluster, method: str, path: str, body: Any = None, tenant: str | None = None
) -> tuple[int, dict[str, Any]]:
    headers = {TENANT_HEADER: tenant} if tenant is not None else {}
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, cluster.node.url + path, json=body, headers=headers) as resp,
    ):
        return resp.status, await resp.json()


def _error(body: dict[str, Any]) -> dict[str, Any]:
    err = body["error"]
    assert set(err) - {"request_id"} == {"message", "type", "param", "code"} and err["message"]
    assert "Traceback" not in err["message"]
    return dict(err)


@pytest.mark.parametrize(
    ("patch", "param"),
    [
        ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
        ({"input": [{"role": "user", "content": 3}]}, "input[0].content"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content[0].type",
        ),
        ({"input": [{"role": "user"}]}, "input[0].content"),
        ({"input": ["just a string"]}, "input[0]"),
        ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id"),
        ({"input": [{"type": "function_call_output", "call_id": "c"}]}, "input[0].output"),
        ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "input[0].type"),
        (
            {"input": [{"role": "user", "content": "a", "id": "x"}, {"role": "user", "content": "b", "id": "x"}]},
            "input[1].id",
        ),
        ({"input": None}, "input"),
        ({"input": 7}, "input"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tools": [{"type": "function"}]}, "tools[0].name"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"temperature": 9}, "temperature"),
        ({"metadata": {"k": "v" * 600}}, "metadata"),
        ({"previous_response_id": "resp_x", "conversation": "conv_x"}, "previous_response_id"),
    ],
)
async def test_malformed_request_is_400_naming_the_field(cluster: Cluster, patch: dict[str, Any], param: str) -> None:
    body = {"model": cluster.model, "input": "hi", **patch}
    status, answer = await _request(cluster, "POST", "/v1/responses", body)
    assert status == 400, answer
    err = _error(answer)
    assert err["param"] == param and err["type"] == "invalid_request_error"


async def test_unknown_ids_are_404(cluster: Cluster) -> None:
    with pytest.raises(openai.NotFoundError) as err:
        await cluster.client.responses.create(model=cluster.model, input="x", previous_response_id="resp_nope")
    assert err.value.body["param"] == "previous_response_id"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError) as err:
        await cluster.client.responses.create(model=cluster.model, input="x", conversation="conv_nope")
    assert err.value.body["param"] == "conversation"  # type: ignore[index]
    for path in ("/v1/responses/resp_nope", "/v1/responses/resp_nope/input_items", "/v1/conversations/conv_nope"):
        status, body = await _request(cluster, "GET", path)
        assert status == 404 and _error(body)["code"] == "not_found"


async def test_oversized_input_is_413(cluster: Cluster) -> None:
    big = b'{"model": "m", "input": "' + b"a" * (16 * 1024 * 1024 + 10) + b'"}'
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            cluster.node.url + "/v1/responses", data=io.BytesIO(big), headers={"Content-Type": "application/json"}
        ) as resp,
    ):
        assert resp.status == 413
        assert _error(await resp.json())["code"] == "request_too_large"


async def test_bad_list_parameters_are_400(cluster: Cluster) -> None:
    r = await cluster.client.responses.create(model=cluster.model, input="x", max_output_tokens=2)
    for query, param in (("limit=0", "limit"), ("limit=abc", "limit"), ("order=up", "order")):
        status, body = await _request(cluster, "GET", f"/v1/responses/{r.id}/input_items?{query}")
        assert status == 400 and _error(body)["param"] == param
    status, body = await _request(cluster, "GET", f"/v1/responses/{r.id}/input_items?after=msg_unknown")
    assert status == 400


async def test_tenants_do_not_see_each_others_ids(cluster: Cluster) -> None:
    alice = cluster.client.with_options(default_headers={TENANT_HEADER: "alice"})
    bob = cluster.client.with_options(default_headers={TENANT_HEADER: "bob"})
    r = await alice.responses.create(model=cluster.model, input="secret", max_output_tokens=3)
    conv = await alice.conversations.create(items=[{"role": "user", "content": "private"}])
    assert (await alice.responses.retrieve(r.id)).id == r.id
    for call in (
        bob.responses.retrieve(r.id),
        bob.responses.delete(r.id),
        bob.responses.input_items.list(r.id),
        bob.responses.create(model=cluster.model, input="x", previous_response_id=r.id),
        bob.conversations.retrieve(conv.id),
        bob.conversations.items.list(conv.id),
        bob.responses.create(model=cluster.model, input="x", conversation=conv.id),
        cluster.client.responses.retrieve(r.id),  # no header: the default tenant
    ):
        with pytest.raises(openai.NotFoundError):
            await call
    assert (await alice.responses.retrieve(r.id)).id == r.id
    assert (await alice.conversations.retrieve(conv.id)).id == conv.id
    status, body = await _request(cluster, "GET", f"/v1/responses/{r.id}", tenant="bad tenant")
    assert status == 400 and _error(body)["param"] == TENANT_HEADER


async def test_bad_tenant_header_fails_only_routes_that_use_a_tenant(cluster: Cluster) -> None:
    # The tenant is checked where a route reads it: liveness, readiness and metrics ignore the header.
    for path in ("/health", "/readiness", "/metrics"):
        async with (
            aiohttp.ClientSession() as session,
            session.get(cluster.node.url + path, headers={TENANT_HEADER: "bad tenant"}) as resp,
        ):
            assert resp.status == 200, path
    status, body = await _request(cluster, "GET", "/v1/conversations/conv_x", tenant="bad tenant")
    assert status == 400 and _error(body)["param"] == TENANT_HEADER


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def _redis_server(port: int) -> Iterator[None]:
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
            time.sleep(0.05)
        yield
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@dataclass
class DownStore:
    """A history backend that is down when the node starts; `serving()` brings it up for the block and takes
    it down again at the end (live connections cut, as in a crash)."""

    config: StorageConfig
    serving: Callable[[], contextlib.AbstractAsyncContextManager[None]]


@contextlib.asynccontextmanager
async def _down_redis() -> AsyncIterator[DownStore]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed: the outage cannot be ended")
    port = _free_port()  # nothing listens here until serving()

    @contextlib.asynccontextmanager
    async def serving() -> AsyncIterator[None]:
        with _redis_server(port):
            yield

    yield DownStore(
        StorageConfig(backend="redis", redis_url=f"redis://127.0.0.1:{port}/0", connect_timeout_s=0.5), serving
    )


@contextlib.asynccontextmanager
async def _down_postgres() -> AsyncIterator[DownStore]:
    if not port_open(PG_PORT):
        pytest.skip("postgres is not running on 127.0.0.1")
    proxy = TcpProxy(PG_PORT)  # not started: refuses connections, like a server that is down
    prefix = f"t{uuid.uuid4().hex[:10]}_"

    @contextlib.asynccontextmanager
    async def serving() -> AsyncIterator[None]:
        await proxy.start()
        try:
            yield
        finally:
            await proxy.stop()

    config = StorageConfig(
        backend="postgres",
        postgres_url=f"postgresql://postgres@127.0.0.1:{proxy.port}/test",
        table_prefix=prefix,
        connect_timeout_s=0.5,
        command_timeout_s=0.5,
    )
    try:
        yield DownStore(config, serving)
    finally:
        await proxy.stop()
        await drop_tables(PG_URL, prefix)


async def _expect_503(call: Awaitable[object]) -> dict[str, Any]:
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError) as err:
        await call
    assert err.value.status_code == 503 and time.monotonic() - started < 2.0
    body: dict[str, Any] = err.value.body  # type: ignore[assignment]
    return body


def _received(c: Cluster) -> float:
    """When the (only) worker last received a generation request."""
    return c.sims[0].engine.server_snapshot().last_receive_timestamp


async def _expect_503_before_generating(c: Cluster) -> None:
    """A store=true stream fails with a plain 503 (no stream starts) and the worker never sees it."""
    received = _received(c)
    body = await _expect_503(c.client.responses.create(model=c.model, input="hi", max_output_tokens=4, stream=True))
    assert body["code"] == "storage_unavailable" and "store=false" in body["message"]
    assert _received(c) == received, "an answer was generated that could not be stored"


async def _store_false_works(c: Cluster) -> None:
    r = await c.client.responses.create(model=c.model, input="hi", max_output_tokens=4, store=False)
    assert r.output_text


async def _stores_once_back(c: Cluster, store: DownStore, text: str) -> str:
    """With the store serving again (for this call only), once OUTAGE_HOLD_S has passed a stored response
    round-trips without a restart. Returns its id."""
    async with store.serving():
        await asyncio.sleep(OUTAGE_HOLD_S)
        r = await c.client.responses.create(model=c.model, input=text, max_output_tokens=4)
        assert (await c.client.responses.retrieve(r.id)).id == r.id
    return r.id


@pytest.mark.parametrize("down_store", [_down_redis, _down_postgres], ids=["redis", "postgres"])
async def test_storage_outage_is_503_while_store_false_works_and_recovers(
    llama3_model_dir: Path, down_store: Callable[[], contextlib.AbstractAsyncContextManager[DownStore]]
) -> None:
    async with down_store() as store, start_cluster(llama3_model_dir, workers=1, storage=store.config) as c:
        # Nothing was ever heard from the store: the first request that must write probes it and fails at once.
        await _expect_503_before_generating(c)
        # From then on the outage is known: requests that need the store fail before generating.
        for stream in (False, True):
            body = await _expect_503(
                c.client.responses.create(model=c.model, input="hi", max_output_tokens=4, stream=stream)
            )
            assert body["code"] == "storage_unavailable" and "store=false" in body["message"]
        for call in (c.client.responses.retrieve("resp_x"), c.client.conversations.create()):
            await _expect_503(call)
        await _store_false_works(c)
        stored = await _stores_once_back(c, store, "back")
        # A second outage, with live connections in the node's pool cut, that no request has noticed yet: once
        # the store has been silent for PROBE_AFTER_S, the next request that must write probes it first.
        await asyncio.sleep(PROBE_AFTER_S)
        await _expect_503_before_generating(c)
        await _expect_503(c.client.responses.retrieve(stored))
        await _store_false_works(c)
        await _stores_once_back(c, store, "again")


# Requests tried against the churned conversation before one must have met the contention.
CONTENTION_ATTEMPTS = 3


async def test_contention_is_503_without_tripping_the_outage_gate(llama3_model_dir: Path) -> None:
    """Writes to one conversation that keep losing to concurrent writers (Postgres at REPEATABLE READ, a
    helper committing updates of the conversation row all along) answer 503 storage_contended once the
    store's retries run out; the store is up, so other requests that need it are still served at once."""
    if not port_open(PG_PORT):
        pytest.skip("postgres is not running on 127.0.0.1")
    prefix = f"t{uuid.uuid4().hex[:10]}_"
    url = PG_URL + "?default_transaction_isolation=repeatable%20read"
    storage = StorageConfig(backend="postgres", postgres_url=url, table_prefix=prefix)
    try:
        async with start_cluster(llama3_model_dir, workers=1, storage=storage) as c:
            conv = await c.client.conversations.create(items=[{"role": "user", "content": "Hello"}])
            turn = {"model": c.model, "input": "Again", "conversation": conv.id, "max_output_tokens": 4}
            async with churned_conversation(PG_URL, prefix, DEFAULT_TENANT, conv.id):
                # On a loaded machine a write may still slip in between the helper's commit and its next update
                # (the retry that follows a conflict starts right then): that request is simply stored, and
                # the next one meets the contention. What is asserted is what a contended write answers.
                for _ in range(CONTENTION_ATTEMPTS):
                    try:
                        await c.client.responses.create(**turn)  # type: ignore[call-overload]
                    except openai.APIStatusError as exc:
                        err = exc
                        break
                else:
                    raise AssertionError(f"no write met the contention in {CONTENTION_ATTEMPTS} tries")
                assert err.status_code == 503, err
                body: Any = err.body
                assert body["code"] == "storage_contended" and body["param"] == "conversation"
                assert body["message"] == CONTENDED_MESSAGE
                for _ in range(CONTENTION_ATTEMPTS):
                    stream = await c.client.responses.create(**turn, stream=True)  # type: ignore[call-overload]
                    last = [e async for e in stream][-1]
                    if last.type == "response.failed":
                        break
                    assert last.type in ("response.completed", "response.incomplete"), last.type  # stored
                assert last.type == "response.failed" and last.response.error.message == CONTENDED_MESSAGE
                # Not an outage: the gate stays shut and requests that need the store go through.
                with pytest.raises(openai.NotFoundError):
                    await c.client.responses.retrieve("resp_nope")
                other = await c.client.responses.create(model=c.model, input="elsewhere", max_output_tokens=4)
                assert (await c.client.responses.retrieve(other.id)).id == other.id
            r = await c.client.responses.create(**turn)  # type: ignore[call-overload]
            assert (await c.client.responses.retrieve(r.id)).conversation is not None
    finally:
        await drop_tables(PG_URL, prefix)
