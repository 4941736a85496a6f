"""Generate over our own HTTP/2 reader against the real simulated engine (a grpc.aio server), next to grpc.aio."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import aiohttp
import grpc
import pytest

from node.app import run_node
from node.errors import WorkerFailed
from node.sim import SimModel, SimWorker, SimWorkerConfig, load_sim_model
from node.sim.engine import SimEngine
from node.sim.health import HealthService
from node.sim.servicer import SimEngineServicer
from node.workers.breaker_client import BreakerClient
from node.workers.client import WorkerRejected
from node.workers.types import SamplingParams, WorkerOutput, WorkerRequest
from node.workers.vllm_grpc import VllmGrpcClient
from tests.http.conftest import fast_sim, node_config
from tests.sim.conftest import write_llama3_folder

PROMPT = list(range(1000, 1040))
LONG_CONTEXT = 200_000


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = write_llama3_folder(tmp_path_factory.mktemp("models") / "llama3-long")
    config = json.loads((folder / "config.json").read_text())
    config["max_position_embeddings"] = LONG_CONTEXT  # room for prompts far beyond the 64 KiB initial window
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def sim_model(model_dir: Path) -> SimModel:
    return load_sim_model(SimWorkerConfig(model_path=str(model_dir)))


def _config(model_dir: Path, tpot_ms: float = 0.0) -> SimWorkerConfig:
    return SimWorkerConfig(
        model_path=str(model_dir),
        port=0,
        ttft_base_ms=0,
        ttft_per_uncached_token_ms=0,
        tpot_ms=tpot_ms,
        tpot_per_running_ms=0,
    )


@pytest.fixture
async def worker(model_dir: Path, sim_model: SimModel) -> AsyncIterator[SimWorker]:
    async with SimWorker(_config(model_dir), sim_model) as running:
        yield running


@pytest.fixture
async def client(worker: SimWorker) -> AsyncIterator[VllmGrpcClient]:
    c = VllmGrpcClient(f"grpc://{worker.address}", generate_transport="h2")
    yield c
    await c.close()


def _request(
    request_id: str, prompt: list[int] | None = None, *, stream: bool = True, **params: object
) -> WorkerRequest:
    sampling = SamplingParams(**{"max_tokens": 20, "temperature": 0.0, "seed": 7, **params})  # type: ignore[arg-type]
    return WorkerRequest(request_id, PROMPT if prompt is None else prompt, sampling, stream=stream)


async def _collect(client: VllmGrpcClient, request: WorkerRequest) -> list[WorkerOutput]:
    return [out async for out in client.generate(request)]


def _per_choice(outs: list[WorkerOutput]) -> tuple[dict[int, list[int]], dict[int, WorkerOutput]]:
    """What a reader gets per choice: its ids in order, and its last output's other fields."""
    ids: dict[int, list[int]] = {}
    last: dict[int, WorkerOutput] = {}
    for out in outs:
        ids.setdefault(out.index, []).extend(out.token_ids)
        last[out.index] = out._replace(token_ids=[], cached_tokens=0)
    return ids, last


async def test_h2_and_grpc_transports_give_the_same_outputs(worker: SimWorker) -> None:
    h2 = VllmGrpcClient(f"grpc://{worker.address}", generate_transport="h2")
    aio = VllmGrpcClient(f"grpc://{worker.address}", generate_transport="grpc")
    try:
        cases = [
            _request("s", max_tokens=50),
            _request("ns", stream=False, max_tokens=50),
            _request("n3", n=3, max_tokens=30),
            _request("lp", logprobs=3, max_tokens=10),
            _request("ns-n2-lp", stream=False, n=2, logprobs=2, max_tokens=10),
        ]
        for req in cases:
            got, want = await _collect(h2, req), await _collect(aio, req)
            # The second call finds the prompt in the engine's prefix cache; everything else is identical.
            if req.params.n == 1 and req.params.logprobs is None:
                # The h2 client merges a run of chunks that arrived together (grpc.aio hands each over alone).
                assert _per_choice(got) == _per_choice(want)
            else:
                assert [o._replace(cached_tokens=0) for o in got] == [o._replace(cached_tokens=0) for o in want]
            assert got[-1].finish_reason is not None
    finally:
        await h2.close()
        await aio.close()


async def test_streams_outputs_with_logprobs_and_n(client: VllmGrpcClient) -> None:
    outs = await _collect(client, _request("a", n=2, logprobs=2, max_tokens=12, ignore_eos=True))
    finished = [o for o in outs if o.finish_reason is not None]
    assert sorted(o.index for o in finished) == [0, 1]
    chunks = [o for o in outs if o.finish_reason is None]
    assert all(o.logprobs is not None and len(o.logprobs.token_ids) == len(o.token_ids) for o in chunks)
    assert sum(len(o.token_ids) for o in chunks) == 24


async def test_a_prompt_far_beyond_the_initial_window_is_sent_as_the_windows_open(client: VllmGrpcClient) -> None:
    prompt = [100_000 + i % 20_000 for i in range(150_000)]  # ~450 KB of varints: 7x the 64 KiB window
    outs = await _collect(client, _request("long", prompt, max_tokens=3, ignore_eos=True))
    assert outs[-1].prompt_tokens == len(prompt)
    assert outs[-1].finish_reason == "length"


async def test_invalid_argument_maps_to_the_same_worker_failed_as_grpc_aio(worker: SimWorker) -> None:
    messages = []
    for transport in ("h2", "grpc"):
        c = VllmGrpcClient(f"grpc://{worker.address}", generate_transport=transport)
        with pytest.raises(WorkerFailed) as caught:
            await _collect(c, _request("bad", [1] * (LONG_CONTEXT + 1)))
        messages.append(caught.value.message)
        assert isinstance(caught.value, WorkerRejected), f"{transport}: the request's fault, not the worker's"
        await c.close()
    assert messages[0] == messages[1]
    assert "INVALID_ARGUMENT" in messages[0]


async def test_many_concurrent_streams_share_one_connection(client: VllmGrpcClient) -> None:
    results = await asyncio.gather(
        *(_collect(client, _request(f"c{i}", max_tokens=8, ignore_eos=True)) for i in range(200))
    )
    assert all(sum(len(o.token_ids) for o in outs if o.finish_reason is None) == 8 for outs in results)


@pytest.fixture
async def limited_worker(model_dir: Path, sim_model: SimModel) -> AsyncIterator[tuple[str, SimEngine]]:
    """The simulated engine behind a server that allows 2 concurrent streams per connection."""
    config = _config(model_dir, tpot_ms=2.0)
    server = grpc.aio.server(options=[("grpc.max_concurrent_streams", 2)])
    port = server.add_insecure_port("127.0.0.1:0")
    engine = SimEngine(config, sim_model.folder, sim_model.vocabulary, endpoint=("127.0.0.1", port))
    SimEngineServicer(engine).register(server)
    HealthService(("vllm.grpc.engine.VllmEngine",)).register(server)
    await server.start()
    try:
        yield f"grpc://127.0.0.1:{port}", engine
    finally:
        engine.close()
        await server.stop(None)


async def test_calls_beyond_the_servers_stream_limit_wait_for_a_free_stream(
    limited_worker: tuple[str, SimEngine],
) -> None:
    url, engine = limited_worker
    c = VllmGrpcClient(url, generate_transport="h2")
    peak = 0

    async def watch() -> None:
        nonlocal peak
        while True:
            peak = max(peak, engine.active_requests)
            await asyncio.sleep(0.001)

    watcher = asyncio.create_task(watch())
    try:
        results = await asyncio.gather(
            *(_collect(c, _request(f"q{i}", max_tokens=5, ignore_eos=True)) for i in range(12))
        )
    finally:
        watcher.cancel()
        await c.close()
    assert all(outs[-1].finish_reason == "length" for outs in results)
    assert 1 <= peak <= 2


async def test_leaving_early_resets_the_stream_and_the_engine_cancels_the_request(
    model_dir: Path, sim_model: SimModel
) -> None:
    async with SimWorker(_config(model_dir, tpot_ms=5.0), sim_model) as slow:
        c = VllmGrpcClient(f"grpc://{slow.address}", generate_transport="h2")
        stream = c.generate(_request("early", max_tokens=2000, ignore_eos=True))
        first = await anext(stream)
        assert first.token_ids
        assert "early" in slow.engine.active_request_ids
        await stream.aclose()
        started = time.monotonic()
        while "early" in slow.engine.active_request_ids:
            assert time.monotonic() - started < 0.1, "the engine never saw the stream cancelled"
            await asyncio.sleep(0.002)
        assert slow.engine.cancelled_requests == 1
        # The connection stays usable after a reset.
        outs = await _collect(c, _request("after", max_tokens=4, ignore_eos=True))
        assert outs[-1].finish_reason == "length"
        await c.close()


class _Proxy:
    """A TCP relay in front of a worker; ``cut()`` drops every relayed connection, as a dying worker would."""

    def __init__(self, target_port: int) -> None:
        self._target_port = target_port
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._target_port)
        self._writers += [writer, up_writer]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
            except OSError:
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def cut(self) -> None:
        for writer in self._writers:
            writer.transport.abort()
        self._writers.clear()

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


async def test_a_connection_lost_mid_stream_fails_the_stream_and_the_next_call_reconnects(
    model_dir: Path, sim_model: SimModel
) -> None:
    async with SimWorker(_config(model_dir, tpot_ms=5.0), sim_model) as slow:
        proxy = _Proxy(slow.port)
        await proxy.start()
        c = VllmGrpcClient(f"grpc://127.0.0.1:{proxy.port}", generate_transport="h2")
        stream = c.generate(_request("cut", max_tokens=2000, ignore_eos=True))
        await anext(stream)
        proxy.cut()
        with pytest.raises(WorkerFailed) as caught:
            async for _ in stream:
                pass
        assert ": Generate failed: UNAVAILABLE: " in caught.value.message
        outs = await _collect(c, _request("again", max_tokens=4, ignore_eos=True))
        assert outs[-1].finish_reason == "length"
        await c.close()
        await proxy.close()


async def test_a_worker_that_is_not_listening_is_unavailable_like_grpc_aio() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    c = VllmGrpcClient(f"grpc://127.0.0.1:{port}", generate_transport="h2")
    started = time.monotonic()
    with pytest.raises(WorkerFailed) as caught:
        await _collect(c, _request("nobody"))
    assert time.monotonic() - started < 1.0
    assert caught.value.message.startswith(f"worker grpc://127.0.0.1:{port}: Generate failed: UNAVAILABLE: ")
    await c.close()


async def test_the_node_reads_generate_with_the_configured_transport(llama3_model_dir: Path) -> None:
    async with SimWorker(fast_sim(llama3_model_dir)) as sim:
        for transport in ("h2", "grpc"):
            config = node_config(llama3_model_dir, [sim.port])
            config = replace(config, workers=replace(config.workers, generate_transport=transport))
            async with run_node(config) as node:
                client = node.pool.workers[0].client
                assert isinstance(client, BreakerClient)  # the pool counts every Generate's outcome
                assert (getattr(client.inner._ep, "h2", None) is not None) == (transport == "h2")  # type: ignore[attr-defined]
                body = {"model": node.model.name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
                async with aiohttp.ClientSession() as s, s.post(node.url + "/v1/chat/completions", json=body) as r:
                    assert r.status == 200
                    assert (await r.json())["usage"]["completion_tokens"] == 4
