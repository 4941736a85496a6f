"""The simulated engine through a real grpc.aio channel, checked against what vLLM's servicer sends: every
test against both servers (our own HTTP/2 server, the default, and grpcio's)."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import time
import zipfile
from dataclasses import replace
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from smg_grpc_proto.generated import common_pb2, vllm_engine_pb2, vllm_engine_pb2_grpc

from node.sim import SimModel, SimWorker, SimWorkerConfig
from node.sim.config import SIM_SERVERS
from node.sim.worker import PortBindError

PROMPT = list(range(1000, 1040))
EOT = 128009


@pytest.fixture(params=SIM_SERVERS)
def fast_config(request: pytest.FixtureRequest, fast_config: SimWorkerConfig) -> SimWorkerConfig:
    return replace(fast_config, server=request.param)


def request(request_id: str = "r", prompt: list[int] | None = None, *, stream: bool = True, **sampling: Any) -> Any:
    return vllm_engine_pb2.GenerateRequest(
        request_id=request_id,
        tokenized=vllm_engine_pb2.TokenizedInput(input_ids=prompt or PROMPT),
        sampling_params=vllm_engine_pb2.SamplingParams(**sampling),
        stream=stream,
    )


def stub(channel: grpc.aio.Channel) -> Any:
    return vllm_engine_pb2_grpc.VllmEngineStub(channel)


async def read_rest(call: Any) -> list[Any]:
    rest = []
    while (reply := await call.read()) is not grpc.aio.EOF:  # type: ignore[attr-defined]
        rest.append(reply)
    return rest


async def responses(channel: grpc.aio.Channel, message: Any) -> list[Any]:
    return [response async for response in stub(channel).Generate(message)]


async def test_streaming_matches_the_reference_servicer(channel: grpc.aio.Channel) -> None:
    replies = await responses(channel, request(max_tokens=200))
    chunks = [r.chunk for r in replies if r.HasField("chunk")]
    completes = [r.complete for r in replies if r.HasField("complete")]
    assert len(completes) == 1
    assert replies[-1].HasField("complete")
    complete = completes[0]
    tokens = [t for chunk in chunks for t in chunk.token_ids]
    assert all(len(chunk.token_ids) == 1 for chunk in chunks)
    # Counts per chunk: prompt and cached totals, completion as the delta (the SMG router accumulates).
    assert all(c.prompt_tokens == len(PROMPT) and c.completion_tokens == len(c.token_ids) for c in chunks)
    assert tokens[-1] == EOT
    assert complete.finish_reason == "stop"
    assert not complete.HasField("matched_token_id")  # the primary EOS: vLLM reports no stop reason
    # The complete repeats the last delta, as vLLM's DELTA output does.
    assert list(complete.output_ids) == list(chunks[-1].token_ids)
    assert complete.completion_tokens == len(chunks[-1].token_ids)
    assert complete.prompt_tokens == len(PROMPT)


async def test_non_streaming_sends_one_complete_with_every_token(channel: grpc.aio.Channel) -> None:
    streamed = await responses(channel, request("s", max_tokens=30, seed=7))
    replies = await responses(channel, request("n", max_tokens=30, seed=7, stream=False))
    assert len(replies) == 1
    complete = replies[0].complete
    assert list(complete.output_ids) == [t for r in streamed if r.HasField("chunk") for t in r.chunk.token_ids]
    assert complete.completion_tokens == len(complete.output_ids)
    assert complete.cached_tokens == 32  # the first request cached both full prompt blocks


async def test_length_stop_ids_and_ignore_eos(channel: grpc.aio.Channel) -> None:
    (reply,) = await responses(channel, request("len", max_tokens=5, stream=False))
    assert (reply.complete.finish_reason, len(reply.complete.output_ids)) == ("length", 5)
    (reply,) = await responses(channel, request("stop", stop_token_ids=[128001], min_tokens=3, stream=False))
    assert reply.complete.finish_reason == "stop"
    assert reply.complete.matched_token_id == 128001
    assert reply.complete.output_ids[-1] == 128001
    assert len(reply.complete.output_ids) > 3
    (reply,) = await responses(channel, request("ign", ignore_eos=True, max_tokens=300, stream=False))
    assert (reply.complete.finish_reason, len(reply.complete.output_ids)) == ("length", 300)


async def test_n_two_streams_each_index(channel: grpc.aio.Channel) -> None:
    replies = await responses(channel, request("n2", n=2, max_tokens=20))
    completes = [r.complete for r in replies if r.HasField("complete")]
    assert sorted(c.index for c in completes) == [0, 1]
    per_index = {0: [], 1: []}  # type: dict[int, list[int]]
    for reply in replies:
        if reply.HasField("chunk"):
            per_index[reply.chunk.index].extend(reply.chunk.token_ids)
    assert per_index[0] != per_index[1]
    replies = await responses(channel, request("n2-final", n=2, max_tokens=20, stream=False))
    assert [r.complete.index for r in replies] == [0, 1]  # once all are done, in index order
    assert [list(r.complete.output_ids) for r in replies] == [per_index[0], per_index[1]]


@pytest.mark.parametrize(
    ("message", "detail"),
    [
        (vllm_engine_pb2.GenerateRequest(request_id="t", text="hello"), "text input"),
        (request("long", list(range(8193))), "maximum context length"),
        (request("oov", [128300]), "out of vocabulary"),
        (request("zero", max_tokens=0), "max_tokens"),
    ],
)
async def test_invalid_requests_are_invalid_argument(channel: grpc.aio.Channel, message: Any, detail: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await responses(channel, message)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert detail in (caught.value.details() or "")


async def test_abort_ends_the_stream_at_once(fast_config: SimWorkerConfig, sim_model: SimModel) -> None:
    async with (
        SimWorker(replace(fast_config, tpot_ms=20), sim_model) as worker,
        grpc.aio.insecure_channel(worker.address) as channel,
    ):
        call = stub(channel).Generate(request("victim", max_tokens=1000, ignore_eos=True))
        first = await call.read()
        assert first.HasField("chunk")
        info = await stub(channel).GetServerInfo(vllm_engine_pb2.GetServerInfoRequest())
        assert info.active_requests == 1
        started = time.perf_counter()
        await stub(channel).Abort(vllm_engine_pb2.AbortRequest(request_ids=["victim"]))
        rest = await read_rest(call)
        assert time.perf_counter() - started < 0.5
        assert rest[-1].HasField("complete")
        assert rest[-1].complete.finish_reason == "abort"
        assert worker.engine.aborted_request_ids == ("victim",)
        assert worker.engine.active_requests == 0


async def test_client_cancel_releases_the_request(fast_config: SimWorkerConfig, sim_model: SimModel) -> None:
    async with (
        SimWorker(replace(fast_config, tpot_ms=20), sim_model) as worker,
        grpc.aio.insecure_channel(worker.address) as channel,
    ):
        call = stub(channel).Generate(request("walks-away", max_tokens=1000, ignore_eos=True))
        await call.read()
        call.cancel()
        for _ in range(100):
            if worker.engine.active_requests == 0:
                break
            await asyncio.sleep(0.01)
        assert worker.engine.active_requests == 0
        assert worker.engine.cancelled_requests == 1


async def test_shutdown_aborts_in_flight_generations(fast_config: SimWorkerConfig, sim_model: SimModel) -> None:
    worker = SimWorker(replace(fast_config, tpot_ms=20), sim_model)
    await worker.__aenter__()
    async with grpc.aio.insecure_channel(worker.address) as channel:
        call = stub(channel).Generate(request("cut", max_tokens=1000, ignore_eos=True))
        await call.read()
        closing = asyncio.create_task(worker.aclose())
        rest = await read_rest(call)
        await asyncio.wait_for(closing, 3)
    assert rest[-1].complete.finish_reason == "abort"


async def test_model_server_info_loads_and_health(channel: grpc.aio.Channel, model_dir: Any) -> None:
    engine = stub(channel)
    info = await engine.GetModelInfo(vllm_engine_pb2.GetModelInfoRequest())
    assert info.served_model_name == model_dir.name
    assert info.is_generation
    assert info.max_context_length == 8192
    assert info.vocab_size == 128256
    assert list(info.eos_token_ids) == [128001, 128009]
    assert info.bos_token_id == 128000
    assert info.model_path == info.tokenizer_path == str(model_dir)
    assert (info.model_type, list(info.architectures)) == ("llama", ["LlamaForCausalLM"])
    assert json.loads(info.default_sampling_params_json) == {"temperature": 0.6, "top_p": 0.9}

    server = await engine.GetServerInfo(vllm_engine_pb2.GetServerInfoRequest())
    assert server.server_type == "vllm-grpc"
    assert (server.block_size, server.max_num_seqs, server.kv_role) == (16, 256, "")
    assert server.uptime_seconds >= 0

    loads = await engine.GetLoads(vllm_engine_pb2.GetLoadsRequest())
    assert loads.dp_rank_count == 1
    (load,) = loads.loads
    assert (load.num_running_reqs, load.num_waiting_reqs, load.max_running_requests) == (0, 0, 256)
    assert load.max_total_num_tokens == 8192 * 16

    assert (await engine.HealthCheck(vllm_engine_pb2.HealthCheckRequest())).healthy
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "vllm.grpc.engine.VllmEngine"):
        reply = await health.Check(health_pb2.HealthCheckRequest(service=service))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_get_tokenizer_streams_a_zip(channel: grpc.aio.Channel) -> None:
    chunks = [c async for c in stub(channel).GetTokenizer(common_pb2.GetTokenizerRequest())]
    data = b"".join(c.data for c in chunks)
    assert chunks[-1].sha256 == hashlib.sha256(data).hexdigest()
    assert all(not c.sha256 for c in chunks[:-1])
    names = zipfile.ZipFile(io.BytesIO(data)).namelist()
    assert {"tokenizer.json", "tokenizer_config.json", "generation_config.json"} <= set(names)


async def test_kv_events_subscription_resume_and_flush(channel: grpc.aio.Channel) -> None:
    engine = stub(channel)
    subscription = engine.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest(start_sequence_number=0))
    await responses(channel, request("kv", max_tokens=3, stream=False))
    first = await asyncio.wait_for(subscription.read(), 2)
    assert first.sequence_number == 1
    stored = first.events[0].stored
    assert not stored.HasField("parent_block_hash")
    assert [list(b.token_ids) for b in stored.blocks] == [PROMPT[:16], PROMPT[16:32]]
    assert {b.block_size for b in stored.blocks} == {16}
    assert first.events[0].event_id == 1

    flushed = await engine.FlushCache(common_pb2.FlushCacheRequest(timeout_s=1))
    assert flushed.success
    cleared = await asyncio.wait_for(subscription.read(), 2)
    assert cleared.events[-1].HasField("cleared")
    subscription.cancel()

    # Reconnect after batch 1: exactly what was missed, with no gap.
    resumed = engine.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest(start_sequence_number=1))
    replay = await asyncio.wait_for(resumed.read(), 2)
    assert replay.sequence_number == 2
    assert replay.events[-1].HasField("cleared")
    resumed.cancel()


async def test_kv_events_off_answers_unimplemented(fast_config: SimWorkerConfig, sim_model: SimModel) -> None:
    async with (
        SimWorker(replace(fast_config, kv_events=False), sim_model) as worker,
        grpc.aio.insecure_channel(worker.address) as channel,
    ):
        subscription = stub(channel).SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest(start_sequence_number=0))
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await asyncio.wait_for(subscription.read(), 2)
        assert raised.value.code() is grpc.StatusCode.UNIMPLEMENTED


async def test_prefill_role_returns_kv_transfer_params(fast_config: SimWorkerConfig, sim_model: SimModel) -> None:
    async with (
        SimWorker(replace(fast_config, role="prefill"), sim_model) as worker,
        grpc.aio.insecure_channel(worker.address) as channel,
    ):
        server = await stub(channel).GetServerInfo(vllm_engine_pb2.GetServerInfoRequest())
        assert server.kv_role == "kv_producer"
        assert server.kv_engine_id == f"sim-{worker.address}"
        (reply,) = await responses(channel, request("pd", max_tokens=1, stream=False))
        params = json.loads(reply.complete.kv_transfer_params_json)
        assert params["remote_request_id"] == "pd"
        assert params["remote_port"] == worker.port
        assert params["do_remote_prefill"] is True


async def test_a_taken_port_fails_loudly(worker: SimWorker, sim_model: SimModel) -> None:
    with pytest.raises(PortBindError):
        async with SimWorker(replace(worker.config, port=worker.port), sim_model):
            pass


async def test_a_call_to_a_bound_worker_is_answered_once_it_starts(
    fast_config: SimWorkerConfig, sim_model: SimModel
) -> None:
    """The demo hands out a worker's address while its model loads: a health check made meanwhile waits in the
    backlog and passes when the worker starts, rather than failing and waiting for the next check."""
    worker = SimWorker(fast_config)
    port = worker.bind()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            check = asyncio.ensure_future(
                health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
            )
            await asyncio.sleep(0.3)
            assert not check.done()
            await worker.start(sim_model)
            assert worker.port == port
            reply = await check
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        await worker.aclose()


async def test_a_bound_worker_never_started_frees_its_port(fast_config: SimWorkerConfig, sim_model: SimModel) -> None:
    worker = SimWorker(fast_config)
    port = worker.bind()
    await worker.aclose()
    async with SimWorker(replace(fast_config, port=port), sim_model) as again:
        assert again.port == port
