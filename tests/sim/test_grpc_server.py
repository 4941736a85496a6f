"""The simulated engine's own gRPC server (node/sim/grpc_server.py) where grpcio's would behave differently:
an unknown method, a client that stops reading, a handler that never waits."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from dataclasses import replace

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from smg_grpc_proto.generated import vllm_engine_pb2

from node.sim import SimModel, SimWorker, SimWorkerConfig
from node.sim.grpc_server import PACE_BYTES, NativeGrpcServer
from node.workers import h2_frames as f
from node.workers.grpc_wire import encode_message
from node.workers.types import SamplingParams, WorkerRequest
from node.workers.vllm_grpc import VllmGrpcClient
from tests.sim.test_h2_server import call

BOUND_S = 10.0


async def test_an_unknown_method_is_unimplemented(worker: SimWorker) -> None:
    async with grpc.aio.insecure_channel(worker.address) as channel:
        method = channel.unary_unary("/vllm.grpc.engine.VllmEngine/NoSuchMethod")
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await method(b"")
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED


def _endless_request() -> bytes:
    return bytes(
        vllm_engine_pb2.GenerateRequest(
            request_id="endless", tokenized=vllm_engine_pb2.TokenizedInput(input_ids=[1, 2, 3]), stream=True
        ).SerializeToString()
    )


async def test_a_reader_that_stops_paces_the_stream_and_the_server_goes_on(
    fast_config: SimWorkerConfig, sim_model: SimModel
) -> None:
    """A client that opens a tiny window and never reads again: what the server queues for it stays bounded
    (the endless fault's handler is made to wait), and other calls are still answered at once."""
    async with SimWorker(replace(fast_config, fault="endless"), sim_model) as worker:
        server = worker._server
        assert isinstance(server, NativeGrpcServer)
        host, port = worker.address.rsplit(":", 1)
        loop = asyncio.get_running_loop()
        with socket.create_connection((host, int(port))) as sock:
            sock.setblocking(False)
            hello = f.PREFACE + f.settings_frame({f.SETTINGS_INITIAL_WINDOW_SIZE: 100})
            await loop.sock_sendall(sock, hello + call(1, _endless_request(), "/vllm.grpc.engine.VllmEngine/Generate"))
            await asyncio.sleep(0.5)
            (conn,) = server._connections
            stream = conn.core.stream(1)
            assert stream is not None and 0 < stream.pending_bytes <= PACE_BYTES + 64
            queued = stream.pending_bytes
            async with grpc.aio.insecure_channel(worker.address) as channel:
                health = health_pb2_grpc.HealthStub(channel)
                async with asyncio.timeout(BOUND_S):
                    reply = await health.Check(health_pb2.HealthCheckRequest(service=""))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            await asyncio.sleep(0.2)
            assert stream.pending_bytes == queued  # the handler waits for the window: nothing more was made
            # The window opens: the stream goes on.
            await loop.sock_sendall(sock, f.window_update_frame(1, 1 << 20) + f.window_update_frame(0, 1 << 20))
            await asyncio.sleep(0.2)
            assert stream.pending_bytes <= PACE_BYTES + 64 and conn.core.stream(1) is stream


async def test_a_handler_that_never_waits_does_not_starve_the_server(
    fast_config: SimWorkerConfig, sim_model: SimModel
) -> None:
    """The endless fault yields message after message without awaiting; read by a client with the largest
    window (the node's own), the server still answers another call."""
    async with SimWorker(replace(fast_config, fault="endless"), sim_model) as worker:
        client = VllmGrpcClient(f"grpc://{worker.address}", generate_transport="h2")
        request = WorkerRequest("endless", [1, 2, 3], SamplingParams(max_tokens=20), stream=True)
        flowing = asyncio.Event()

        async def drain() -> None:
            read = 0
            async for out in client.generate(request):
                read += len(out.token_ids)
                if read >= 1000:
                    flowing.set()

        reader = asyncio.create_task(drain())
        try:
            async with asyncio.timeout(BOUND_S):
                await flowing.wait()
            async with grpc.aio.insecure_channel(worker.address) as channel:
                health = health_pb2_grpc.HealthStub(channel)
                async with asyncio.timeout(BOUND_S):
                    reply = await health.Check(health_pb2.HealthCheckRequest(service=""))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
            await client.close()


async def test_stop_sends_goaway_and_ends_open_calls(fast_config: SimWorkerConfig, sim_model: SimModel) -> None:
    worker = await SimWorker(replace(fast_config, fault="hang"), sim_model).start()
    host, port = worker.address.rsplit(":", 1)
    loop = asyncio.get_running_loop()
    with socket.create_connection((host, int(port))) as sock:
        sock.setblocking(False)
        generate = call(1, _endless_request(), "/vllm.grpc.engine.VllmEngine/Generate")
        await loop.sock_sendall(sock, f.PREFACE + f.settings_frame({}) + generate)
        await asyncio.sleep(0.2)
        async with asyncio.timeout(BOUND_S):
            await worker.aclose()
            frames: list[f.Frame] = []
            reader = f.FrameReader()
            while data := await loop.sock_recv(sock, 65536):
                frames += reader.feed(data)
    kinds = [(fr.kind, fr.stream_id) for fr in frames]
    assert (f.GOAWAY, 0) in kinds
    assert (f.RST_STREAM, 1) in kinds  # the hanging call was cut when the grace ran out
    assert encode_message(b"") not in [fr.payload for fr in frames]


async def test_a_client_that_sends_but_never_reads_is_not_read_either(
    fast_config: SimWorkerConfig, sim_model: SimModel
) -> None:
    """A PING flood from a client that reads nothing: each PING asks for an ACK, and the server stops reading
    once its ACKs back up, so what it holds for that client stays bounded."""
    async with SimWorker(fast_config, sim_model) as worker:
        server = worker._server
        assert isinstance(server, NativeGrpcServer)
        host, port = worker.address.rsplit(":", 1)
        loop = asyncio.get_running_loop()
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.setblocking(False)
            await loop.sock_connect(sock, (host, int(port)))
            pings = f.frame(f.PING, 0, 0, b"12345678") * 10_000  # 170 KB a batch
            await loop.sock_sendall(sock, f.PREFACE + f.settings_frame({}))
            sent = 0
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(3.0):
                    while sent < 300 * len(pings):  # 51 MB: many times what the kernel's buffers hold
                        await loop.sock_sendall(sock, pings)
                        sent += len(pings)
            (conn,) = server._connections
            transport = conn._transport
            assert transport is not None
            assert sent < 300 * len(pings)  # the server stopped reading: the client's sends stalled
            assert transport.get_write_buffer_size() < 1024 * 1024
