"""Connections that hold a node's resources without a request: idle, slowloris, a client that reads nothing, too
many of them. A real node on real sockets; the timeouts are short so the test is too."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import socket
import time
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio

from node.config import HttpConfig
from tests.http.conftest import Cluster, start_cluster

pytestmark = pytest.mark.asyncio(loop_scope="module")

HEADER_TIMEOUT_S = 2.0
IDLE_TIMEOUT_S = 3.5
BODY_TIMEOUT_S = 1.0
WRITE_TIMEOUT_S = 1.0
#: A slowloris client sends one byte of its headers this often (well inside the header timeout: each byte is
#: "progress", which must not keep the connection open).
DRIBBLE_S = 0.5
SLOWLORIS = 20
NON_READING = 10
#: A client that reads nothing takes at most this much of the node's socket buffer (the kernel's window
#: then closes), so the node's transport buffer fills within a second of streaming.
CLIENT_RCVBUF_BYTES = 4096
#: Long enough (at TPOT_S per token) that a generation ending before it was aborted, not finished.
LONG_ANSWER_TOKENS = 8000
TPOT_S = 0.001
#: How much the node's process (this test process) may grow while under all of the patterns at once.
RSS_GROWTH_BOUND_BYTES = 80 * 1024 * 1024
#: Slack for a timeout to be seen by the client (loop lag of a busy 2-core machine, kernel).
SLACK_S = 2.0


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def guarded(llama3_model_dir: Path) -> AsyncIterator[Cluster]:
    http = HttpConfig(
        port=0,
        header_timeout_s=HEADER_TIMEOUT_S,
        idle_timeout_s=IDLE_TIMEOUT_S,
        body_timeout_s=BODY_TIMEOUT_S,
        write_timeout_s=WRITE_TIMEOUT_S,
    )
    async with start_cluster(llama3_model_dir, workers=1, http=http, tpot_ms=TPOT_S * 1000) as c:
        yield c


def _request(path: str, body: dict[str, object]) -> bytes:
    data = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: node\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    )
    return head.encode() + data


def _long_stream(model: str) -> bytes:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "a long story"}],
        "max_tokens": LONG_ANSWER_TOKENS,
        "ignore_eos": True,
        # ~1 KB per token instead of ~0.2: the answer is many times what the node's socket and transport
        # buffers hold, so the stalled write, not the end of the answer, is what ends it.
        "logprobs": True,
        "top_logprobs": 5,
        "stream": True,
    }
    return _request("/v1/chat/completions", body)


def _rss_bytes() -> int:
    with open("/proc/self/statm", "rb") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def _closed_by_server(reader: asyncio.StreamReader, within_s: float) -> bool:
    """Whether the server closes (FIN or reset) the connection within ``within_s``, reading what it sends."""
    try:
        async with asyncio.timeout(within_s):
            while await reader.read(65536):
                pass
    except TimeoutError:
        return False
    except ConnectionError:
        pass
    return True


async def _non_reading_client(port: int, request: bytes) -> socket.socket:
    """A client that sends ``request`` and then never reads (a small receive buffer, so it fills quickly)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, CLIENT_RCVBUF_BYTES)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, ("127.0.0.1", port))
    await loop.sock_sendall(sock, request)
    return sock


async def _slowloris(port: int, opened: asyncio.Event) -> float:
    """Dribble a request head a byte every DRIBBLE_S; return how long until the server closed the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    opened.set()
    started = time.monotonic()
    head = b"GET /health HTTP/1.1\r\nHost: node\r\nX-Padding: " + b"a" * 1000
    try:
        for k in range(len(head)):
            writer.write(head[k : k + 1])
            await writer.drain()
            if await _closed_by_server(reader, DRIBBLE_S):
                break
    except ConnectionError:
        pass
    finally:
        writer.close()
    return time.monotonic() - started


async def _metrics(cluster: Cluster) -> str:
    async with aiohttp.ClientSession() as session, session.get(cluster.node.url + "/metrics") as resp:
        return await resp.text()


def _sample(text: str, name: str, reason: str | None = None) -> float:
    label = f'{{reason="{reason}"}}' if reason else ""
    match = re.search(rf"^{name}{re.escape(label)} (\S+)$", text, re.M)
    assert match, f"{name}{label} not in /metrics"
    return float(match.group(1))


async def _legit(cluster: Cluster, stop: asyncio.Event, latencies: list[float], failures: list[str]) -> None:
    """Small chat completions, 4 at a time, until ``stop``: each must succeed."""

    async def one() -> None:
        started = time.monotonic()
        try:
            r = await cluster.client.chat.completions.create(
                model=cluster.model, messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
            assert r.choices[0].message.content
            latencies.append(time.monotonic() - started)
        except Exception as exc:
            failures.append(repr(exc))

    while not stop.is_set():
        await asyncio.gather(*(one() for _ in range(4)))


async def _under_pressure(cluster: Cluster, idle_count: int) -> None:
    port = cluster.node.port
    engine = cluster.sims[0].engine
    aborted_before = len(engine.aborted_request_ids)
    metrics_before = await _metrics(cluster)
    baseline = peak = _rss_bytes()

    async def sample() -> None:
        nonlocal peak
        while True:
            peak = max(peak, _rss_bytes())
            await asyncio.sleep(0.02)

    sampler = asyncio.create_task(sample())
    stop = asyncio.Event()
    latencies: list[float] = []
    failures: list[str] = []
    legit = asyncio.create_task(_legit(cluster, stop, latencies, failures))
    streams: list[socket.socket] = []
    try:
        started = time.monotonic()
        idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(idle_count)]
        opened = [asyncio.Event() for _ in range(SLOWLORIS)]
        slow: list[Awaitable[float]] = [asyncio.create_task(_slowloris(port, e)) for e in opened]
        streams = [await _non_reading_client(port, _long_stream(cluster.model)) for _ in range(NON_READING)]
        await asyncio.gather(*(e.wait() for e in opened))
        opened_in = time.monotonic() - started

        # Every idle connection is closed by the header timeout (they never sent a byte).
        closed = await asyncio.gather(*(_closed_by_server(r, HEADER_TIMEOUT_S + opened_in + SLACK_S) for r, _ in idle))
        assert all(closed), f"{closed.count(False)} of {idle_count} idle connections still open"
        for _, w in idle:
            w.close()
        # Slowloris too, although each sent a byte every DRIBBLE_S.
        lasted = await asyncio.gather(*slow)
        assert max(lasted) < HEADER_TIMEOUT_S + SLACK_S, lasted
        assert min(lasted) >= HEADER_TIMEOUT_S - 0.1, "closed before its time"
        # The non-reading clients' generations are aborted: the worker sees an Abort for each (a finished
        # generation is never aborted; ignore_eos and no stop strings, so nothing else ends these early).
        deadline = time.monotonic() + 10
        while len(engine.aborted_request_ids) - aborted_before < NON_READING or engine.active_request_ids:
            assert time.monotonic() < deadline, (
                len(engine.aborted_request_ids) - aborted_before,
                engine.active_request_ids,
            )
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await legit
        sampler.cancel()
        for sock in streams:
            sock.close()
    assert not failures, failures[:3]
    assert len(latencies) >= 8, "legitimate requests kept being served"
    assert peak - baseline < RSS_GROWTH_BOUND_BYTES, f"RSS grew by {(peak - baseline) / 2**20:.0f} MiB"
    after = await _metrics(cluster)

    def grew(reason: str) -> float:
        name = "smg_node_http_connections_closed_total"
        return _sample(after, name, reason) - _sample(metrics_before, name, reason)

    assert grew("header_timeout") >= idle_count + SLOWLORIS
    assert grew("write_timeout") >= NON_READING


async def test_idle_slowloris_and_non_reading_clients_are_closed_while_requests_are_served(guarded: Cluster) -> None:
    await _under_pressure(guarded, idle_count=300)


@pytest.mark.slow
async def test_two_thousand_idle_connections(guarded: Cluster) -> None:
    await _under_pressure(guarded, idle_count=2000)


async def test_a_client_that_reads_nothing_has_its_worker_request_aborted(guarded: Cluster) -> None:
    engine = guarded.sims[0].engine
    completed_before = engine.completed_requests
    sock = await _non_reading_client(guarded.node.port, _long_stream(guarded.model))
    loop = asyncio.get_running_loop()
    try:
        first = await loop.sock_recv(sock, 2048)  # the headers and first event, then never again
        request_id = re.search(rb'"id":"([^"]+)"', first)
        assert request_id, first
        rid = request_id.group(1).decode()
        started = time.monotonic()
        # The node ends the Generate stream (RST_STREAM) and then sends Abort: the engine may drop the request
        # on the reset before the Abort arrives, so the Abort is awaited on its own, not while still active.
        while rid not in engine.aborted_request_ids:
            assert time.monotonic() - started < 10, "the worker never saw an Abort"
            await asyncio.sleep(0.02)
    finally:
        sock.close()
    assert rid not in engine.active_request_ids
    # Cut short, not answered to the end (8,000 tokens at 1 ms each would take 8 s; the write timeout is 1 s).
    assert engine.completed_requests == completed_before, "the answer ran to its end"


async def test_a_slow_body_is_cut_and_a_kept_alive_connection_closes_when_idle(guarded: Cluster) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", guarded.node.port)
    head = _request("/v1/chat/completions", {"model": guarded.model, "messages": []})
    writer.write(head[:-5])  # the head and all of the body but its last bytes
    started = time.monotonic()
    assert await _closed_by_server(reader, BODY_TIMEOUT_S + SLACK_S)
    assert time.monotonic() - started >= BODY_TIMEOUT_S - 0.1
    writer.close()

    reader, writer = await asyncio.open_connection("127.0.0.1", guarded.node.port)
    writer.write(b"GET /health HTTP/1.1\r\nHost: node\r\n\r\n")
    response = await reader.readuntil(b"}")
    assert response.startswith(b"HTTP/1.1 200")
    started = time.monotonic()
    # Idle, not sending: the header timeout does not apply to a kept-alive connection until a byte comes.
    assert not await _closed_by_server(reader, HEADER_TIMEOUT_S + 0.5)
    assert await _closed_by_server(reader, IDLE_TIMEOUT_S - HEADER_TIMEOUT_S + SLACK_S)
    assert time.monotonic() - started >= IDLE_TIMEOUT_S - 0.1
    writer.close()


async def test_past_the_cap_waiting_connections_make_room_then_new_ones_are_refused(
    llama3_model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cap = 4
    http = HttpConfig(port=0, max_connections=cap)
    caplog.set_level(logging.WARNING, logger="node.http.connections")
    async with start_cluster(llama3_model_dir, workers=1, http=http, tpot_ms=20.0) as c:
        url = c.node.url
        # Four idle connections fill the cap; a real request still gets through (the oldest idle one goes).
        idle = [await asyncio.open_connection("127.0.0.1", c.node.port) for _ in range(cap)]
        async with aiohttp.ClientSession() as session:
            async with session.get(url + "/health") as resp:
                assert resp.status == 200
            assert await _closed_by_server(idle[0][0], SLACK_S)
            for _, w in idle:
                w.close()

            # Four connections busy streaming: a fifth is refused, in OpenAI's error envelope.
            body = {
                "model": c.model,
                "messages": [{"role": "user", "content": "a long story"}],
                "max_tokens": 2000,
                "ignore_eos": True,
                "stream": True,
            }
            async with contextlib.AsyncExitStack() as streams:
                for _ in range(cap):
                    resp = await streams.enter_async_context(session.post(url + "/v1/chat/completions", json=body))
                    assert resp.status == 200
                    await resp.content.readline()
                reader, writer = await asyncio.open_connection("127.0.0.1", c.node.port)
                answer = await reader.read()
                writer.close()
                assert answer.startswith(b"HTTP/1.1 503"), answer
                envelope = json.loads(answer.split(b"\r\n\r\n", 1)[1])
                assert envelope["error"]["code"] == "too_many_connections"
        text = await _metrics(c)  # the streams are closed: there is room again
        assert _sample(text, "smg_node_http_connections_refused_total") >= 1
        assert _sample(text, "smg_node_http_connections_closed_total", "evicted") >= 1
    lines = [r.getMessage() for r in caplog.records if "connection cap" in r.getMessage()]
    assert lines and "--max-connections 4" in lines[0]


async def _health_status(port: int, source: str) -> int:
    """The status of GET /health on a new connection from ``source`` (a 127.0.0.x address)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    try:
        writer.write(b"GET /health HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 10.0)
    except ConnectionError:
        return 0  # refused and reset before the request was read
    finally:
        writer.close()
    status = int(answer.split(b" ", 2)[1])
    if status == 429:
        envelope = json.loads(answer.split(b"\r\n\r\n", 1)[1])
        assert envelope["error"]["code"] == "connection_rate_exceeded"
    return status


async def test_one_address_opening_connections_too_fast_is_refused_429_others_are_not(
    llama3_model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    burst, rate = 10, 5.0
    http = HttpConfig(
        port=0, connection_rate_per_s=rate, connection_rate_burst=burst, connection_rate_exempt=("127.0.0.1/32",)
    )
    caplog.set_level(logging.WARNING, logger="node.http.connections")
    async with start_cluster(llama3_model_dir, workers=1, http=http) as c:
        port = c.node.port
        flood = [await _health_status(port, "127.0.0.2") for _ in range(3 * burst)]
        assert flood[:burst] == [200] * burst, flood
        assert set(flood[burst + 2 :]) <= {429, 0} and flood.count(200) <= burst + 2, flood  # + refill meanwhile
        assert await _health_status(port, "127.0.0.3") == 200  # another address has its own bucket
        assert {await _health_status(port, "127.0.0.1") for _ in range(3 * burst)} == {200}  # exempt
        await asyncio.sleep(2 / rate)
        assert await _health_status(port, "127.0.0.2") == 200  # refilled
        text = await _metrics(c)
        assert _sample(text, "smg_node_http_connections_rate_limited_total") >= 2 * burst - 2
        assert _sample(text, "smg_node_http_connections") <= 2  # refused ones hold no count (the metrics one)
    lines = [r.getMessage() for r in caplog.records if "connection rate" in r.getMessage()]
    assert len(lines) == 1 and "127.0.0.2" in lines[0], lines
