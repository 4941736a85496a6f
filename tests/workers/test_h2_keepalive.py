"""The h2 transport's liveness: the pure keepalive schedule, then real sockets: a half-open connection (a relay
that goes silent) fails its stream within ping-after + timeout, a GOAWAY is honoured, an idle connection
closes and a stalled event loop does not declare a live worker dead."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from node.errors import WorkerFailed
from node.sim import SimModel, SimWorker, SimWorkerConfig, load_sim_model
from node.workers.channel_config import ChannelConfig
from node.workers.grpc_wire import UNAVAILABLE
from node.workers.h2_generate import CallFailed, H2GenerateChannel
from node.workers.h2_keepalive import MAX_PINGS_WITHOUT_DATA, Keepalive, KeepaliveAction, KeepaliveConfig
from node.workers.types import SamplingParams, WorkerRequest
from node.workers.vllm_grpc import VllmGrpcClient
from tests.workers.h2_faults import FreezableProxy, GoawayServer, H2Conn, ack

NONE, PING, DEAD, IDLE = KeepaliveAction.NONE, KeepaliveAction.PING, KeepaliveAction.DEAD, KeepaliveAction.IDLE
CFG = KeepaliveConfig(ping_after_s=1.0, timeout_s=0.5, idle_timeout_s=60.0)


def test_silence_with_open_calls_pings_and_an_unanswered_ping_is_dead() -> None:
    k = Keepalive(CFG, now=0.0)
    assert k.poll(0.5, open_calls=1) == (NONE, 1.0)
    k.heard(0.8, data=True)  # a message: the silence starts again
    assert k.poll(1.0, open_calls=1) == (NONE, 1.8)
    assert k.poll(1.8, open_calls=1) == (PING, 2.3)
    assert k.poll(2.2, open_calls=1) == (NONE, 2.3)
    assert k.poll(2.3, open_calls=1) == (DEAD, math.inf)


def test_pings_back_off_then_stop_until_data_arrives_and_wrong_acks_do_not_count() -> None:
    k = Keepalive(CFG, now=0.0)
    sent = []
    now = 0.0
    while now < 100.0:
        action, next_at = k.poll(now, open_calls=1)
        if action is PING:
            sent.append(now)
            k.acked(now, b"not ours")
            assert k.poll(now + 0.1, open_calls=1)[0] is NONE  # still waiting for its own ACK
            k.acked(now + 0.1, k.ping_payload)
        now = next_at if action is not PING else now + 0.1
    assert sent == [1.0, 3.1, 7.2][:MAX_PINGS_WITHOUT_DATA]  # 1 s, then 2 s and 4 s after the previous ACK
    k.heard(100.0, data=True)
    assert k.poll(101.0, open_calls=1)[0] is PING


def test_a_connection_without_calls_idles_out_and_never_pings() -> None:
    k = Keepalive(CFG, now=0.0)
    k.heard(9.5, data=True)
    assert k.poll(10.0, open_calls=1) == (NONE, 10.5)
    assert k.poll(10.2, open_calls=0) == (NONE, 70.0)  # idle since the last look that saw a call
    assert k.poll(69.0, open_calls=0) == (NONE, 70.0)
    assert k.poll(70.0, open_calls=0) == (IDLE, math.inf)


# --- real sockets ---

PING_AFTER_S = 0.3
TIMEOUT_S = 0.3
FAST = KeepaliveConfig(ping_after_s=PING_AFTER_S, timeout_s=TIMEOUT_S, idle_timeout_s=60.0)


@pytest.fixture(scope="module")
def sim_model(llama3_model_dir: Path) -> SimModel:
    return load_sim_model(SimWorkerConfig(model_path=str(llama3_model_dir)))


@pytest.fixture
async def slow_worker(llama3_model_dir: Path, sim_model: SimModel) -> AsyncIterator[SimWorker]:
    config = SimWorkerConfig(model_path=str(llama3_model_dir), port=0, ttft_base_ms=0, tpot_ms=5.0)
    async with SimWorker(config, sim_model) as worker:
        yield worker


def _long_request(request_id: str) -> WorkerRequest:
    return WorkerRequest(request_id, list(range(1000, 1020)), SamplingParams(max_tokens=5000, ignore_eos=True))


async def test_a_half_open_connection_fails_its_stream_within_ping_after_plus_timeout(
    slow_worker: SimWorker,
) -> None:
    proxy = FreezableProxy(slow_worker.port)
    await proxy.start()
    client = VllmGrpcClient(
        f"grpc://127.0.0.1:{proxy.port}", generate_transport="h2", channel=ChannelConfig(keepalive=FAST)
    )
    try:
        stream = client.generate(_long_request("half-open"))
        await anext(stream)
        proxy.freeze()
        started = time.monotonic()
        with pytest.raises(WorkerFailed) as caught:
            async with asyncio.timeout(10):  # without keepalive it would hang here for good
                async for _ in stream:
                    pass
        took = time.monotonic() - started
        assert "UNAVAILABLE: no answer to a keepalive PING" in caught.value.message
        assert took < PING_AFTER_S + TIMEOUT_S + 0.5, took
    finally:
        await client.close()
        await proxy.close()


async def test_grpc_aio_transport_keepalive_fails_a_half_open_stream_too(slow_worker: SimWorker) -> None:
    proxy = FreezableProxy(slow_worker.port)
    await proxy.start()
    channel = ChannelConfig(keepalive=KeepaliveConfig(timeout_s=0.5), grpc_keepalive_s=0.5)
    client = VllmGrpcClient(f"grpc://127.0.0.1:{proxy.port}", generate_transport="grpc", channel=channel)
    try:
        stream = client.generate(_long_request("half-open-grpc"))
        await anext(stream)
        proxy.freeze()
        started = time.monotonic()
        with pytest.raises(WorkerFailed, match="Generate failed: UNAVAILABLE"):
            async with asyncio.timeout(10):  # grpc core's default ping timeout would make this a minute
                async for _ in stream:
                    pass
        # keepalive + timeout, and grpc core's own floor of 1 s between pings
        assert time.monotonic() - started < 0.5 + 0.5 + 1.0 + 0.5
    finally:
        await client.close()
        await proxy.close()


async def test_a_stalled_loop_does_not_declare_a_live_connection_dead() -> None:
    """The loop is blocked through a PING's whole timeout, and the ACK is written only after: the stream is
    not failed (uvloop runs the overdue timer before it reads the socket; without the grace it would be)."""
    release = asyncio.Event()
    pinged = asyncio.Event()

    async def answer_later(conn: H2Conn, stream_id: int, message: bytes) -> None:
        conn.respond(stream_id, message, end=False)  # then silence: the client will PING
        await release.wait()
        conn.end(stream_id)

    def stall_then_ack(conn: H2Conn, payload: bytes) -> None:
        pinged.set()
        asyncio.get_running_loop().call_soon(ack, conn, payload)  # runs after the stall, beside the timer
        time.sleep(5 * TIMEOUT_S)  # the whole process (our client too) is starved

    server = GoawayServer(answer_later, on_ping=stall_then_ack)
    await server.start()
    channel = H2GenerateChannel(f"127.0.0.1:{server.port}", max_message_bytes=1 << 20, keepalive=FAST)
    try:
        call = channel.call("/svc/Echo", b"x")
        assert await anext(call) == [b"x"]
        waiting = asyncio.ensure_future(anext(call))
        await asyncio.wait_for(pinged.wait(), 5)
        await asyncio.sleep(0.2)
        assert not waiting.done()  # the stream is still open
        release.set()
        with pytest.raises(StopAsyncIteration):
            await waiting
    finally:
        await channel.close()
        await server.close()


async def _echo(conn: H2Conn, stream_id: int, message: bytes) -> None:
    conn.respond(stream_id, message)


async def test_goaway_refused_streams_are_sent_again_on_a_new_connection() -> None:
    async def first_refuses(conn: H2Conn, stream_id: int, message: bytes) -> None:
        if conn.index == 0:
            conn.goaway(last_stream_id=0)  # processed nothing: the call may go again, elsewhere
        else:
            conn.respond(stream_id, message)

    server = GoawayServer(first_refuses)
    await server.start()
    channel = H2GenerateChannel(f"127.0.0.1:{server.port}", max_message_bytes=1 << 20, keepalive=FAST)
    try:
        batches = [batch async for batch in channel.call("/svc/Echo", b"hello")]
        assert batches == [[b"hello"]]
        assert [c.streams for c in server.conns] == [[1], [1]]
    finally:
        await channel.close()
        await server.close()


async def test_after_goaway_running_streams_finish_there_and_new_ones_open_a_new_connection() -> None:
    release = asyncio.Event()

    async def drain_first(conn: H2Conn, stream_id: int, message: bytes) -> None:
        if conn.index == 0:
            conn.respond(stream_id, message, end=False)
            conn.goaway(last_stream_id=stream_id)  # this one will still be answered; no new ones here
            await release.wait()
            conn.more(stream_id, b"last")
            conn.end(stream_id)
        else:
            conn.respond(stream_id, message)

    server = GoawayServer(drain_first)
    await server.start()
    channel = H2GenerateChannel(f"127.0.0.1:{server.port}", max_message_bytes=1 << 20, keepalive=FAST)
    try:
        first = channel.call("/svc/Echo", b"first")
        assert await anext(first) == [b"first"]
        second = [batch async for batch in channel.call("/svc/Echo", b"second")]
        assert second == [[b"second"]]
        release.set()
        assert [batch async for batch in first] == [[b"last"]]
        assert [c.streams for c in server.conns] == [[1], [1]]
    finally:
        await channel.close()
        await server.close()


async def test_a_worker_that_keeps_refusing_with_goaway_fails_unavailable_after_bounded_retries() -> None:
    async def always_goaway(conn: H2Conn, stream_id: int, message: bytes) -> None:
        conn.goaway(last_stream_id=0)

    server = GoawayServer(always_goaway)
    await server.start()
    channel = H2GenerateChannel(f"127.0.0.1:{server.port}", max_message_bytes=1 << 20, keepalive=FAST)
    try:
        with pytest.raises(CallFailed) as caught:
            async for _ in channel.call("/svc/Echo", b"x"):
                pass
        assert caught.value.status.code == UNAVAILABLE
        assert "GOAWAY" in caught.value.status.message
        assert len(server.conns) <= 11
    finally:
        await channel.close()
        await server.close()


async def test_an_idle_connection_is_closed_and_the_next_call_reconnects() -> None:
    server = GoawayServer(_echo)
    await server.start()
    idle = KeepaliveConfig(ping_after_s=1.0, timeout_s=1.0, idle_timeout_s=0.2)
    channel = H2GenerateChannel(f"127.0.0.1:{server.port}", max_message_bytes=1 << 20, keepalive=idle)
    try:
        assert [b async for b in channel.call("/svc/Echo", b"a")] == [[b"a"]]
        await asyncio.sleep(0.5)
        assert [b async for b in channel.call("/svc/Echo", b"b")] == [[b"b"]]
        assert len(server.conns) == 2  # the first one was closed for idling
    finally:
        await channel.close()
        await server.close()
