"""The engine shell without gRPC: latency, FIFO admission, aborts, n > 1, cache accounting, KV events."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from node.routing.kv_events import BlocksStored, CacheCleared
from node.sim import SimModel, SimWorkerConfig
from node.sim.engine import GenerateSpec, SequenceOutput, SimEngine
from node.sim.errors import EngineClosedError, InvalidRequestError
from node.sim.kv_events import KvBatch
from node.sim.token_generator import SamplingSpec

PROMPT = tuple(range(1000, 1040))  # 40 tokens: two full blocks of 16 and a partial one


def make_engine(sim_model: SimModel, config: SimWorkerConfig, **changes: object) -> SimEngine:
    return SimEngine(replace(config, **changes), sim_model.folder, sim_model.vocabulary, endpoint=("h", 7))  # type: ignore[arg-type]


def spec(request_id: str = "r", prompt: tuple[int, ...] = PROMPT, **sampling: object) -> GenerateSpec:
    return GenerateSpec(request_id, prompt, SamplingSpec(**sampling))  # type: ignore[arg-type]


async def collect(outputs: AsyncIterator[SequenceOutput]) -> list[SequenceOutput]:
    return [output async for output in outputs]


async def first_output_after(engine: SimEngine, request: GenerateSpec) -> tuple[float, list[SequenceOutput]]:
    started = time.perf_counter()
    outputs = engine.submit(request)
    first = await anext(outputs)
    elapsed = time.perf_counter() - started
    return elapsed, [first, *await collect(outputs)]


async def test_cache_hit_lowers_time_to_first_token(sim_model: SimModel, fast_config: SimWorkerConfig) -> None:
    engine = make_engine(sim_model, fast_config, ttft_per_uncached_token_ms=0.5)
    long_prompt = tuple(range(2000, 2400))  # 400 tokens: 200 ms uncached
    cold, outputs = await first_output_after(engine, spec("a", long_prompt, max_tokens=2))
    assert outputs[0].cached_tokens == 0
    warm, outputs = await first_output_after(engine, spec("b", long_prompt, max_tokens=2))
    assert outputs[0].cached_tokens == 384  # (400 - 1) // 16 blocks
    assert cold >= 0.18
    assert warm < cold / 2
    assert engine.load_snapshot().cache_hit_rate == pytest.approx(384 / 800)


async def test_fifo_admission_under_the_running_cap(sim_model: SimModel, fast_config: SimWorkerConfig) -> None:
    engine = make_engine(sim_model, fast_config, max_running_requests=1, tpot_ms=4)
    order: list[str] = []

    async def run(request_id: str) -> None:
        outputs = engine.submit(spec(request_id, max_tokens=4, ignore_eos=True))
        order.extend([request_id async for output in outputs if output.output_tokens == 1])

    tasks = [asyncio.create_task(run(name)) for name in ("a", "b", "c")]
    await asyncio.sleep(0.005)
    load = engine.load_snapshot()
    assert (load.running_requests, load.waiting_requests) == (1, 2)
    assert load.waiting_uncached_tokens > 0
    assert load.token_usage > 0
    await asyncio.gather(*tasks)
    assert order == ["a", "b", "c"]
    assert engine.load_snapshot().running_requests == 0


async def test_abort_while_waiting_ends_at_once(sim_model: SimModel, fast_config: SimWorkerConfig) -> None:
    engine = make_engine(sim_model, fast_config, max_running_requests=1, tpot_ms=5)
    running = asyncio.create_task(collect(engine.submit(spec("long", max_tokens=20, ignore_eos=True))))
    waiting = asyncio.create_task(collect(engine.submit(spec("queued", max_tokens=20))))
    await asyncio.sleep(0.01)
    engine.abort(["queued", "unknown"])
    queued = await asyncio.wait_for(waiting, 0.5)
    assert [(o.token_ids, o.finish and o.finish.reason) for o in queued] == [((), "abort")]
    assert engine.aborted_request_ids == ("queued", "unknown")
    long = await running
    assert long[-1].finish is not None and long[-1].finish.reason == "length"
    assert sum(len(o.token_ids) for o in long) == 20


async def test_n_samples_interleave_and_each_index_finishes(sim_model: SimModel, fast_config: SimWorkerConfig) -> None:
    engine = make_engine(sim_model, fast_config)
    outputs = await collect(engine.submit(spec("n3", n=3, max_tokens=30)))
    by_index: dict[int, list[int]] = {0: [], 1: [], 2: []}
    finishes = {}
    for output in outputs:
        by_index[output.index].extend(output.token_ids)
        if output.finish is not None:
            finishes[output.index] = output.finish
    assert sorted(finishes) == [0, 1, 2]
    assert len({tuple(tokens) for tokens in by_index.values()}) == 3
    assert [o.index for o in outputs[:3]] == [0, 1, 2]  # indices run side by side


async def test_closing_the_iterator_early_releases_everything(
    sim_model: SimModel, fast_config: SimWorkerConfig
) -> None:
    engine = make_engine(sim_model, fast_config, tpot_ms=5)
    for n in (1, 2):
        outputs = engine.submit(spec(f"gone-{n}", n=n, max_tokens=50, ignore_eos=True))
        async with contextlib.aclosing(outputs):
            await anext(outputs)
        assert engine.active_requests == 0
        assert engine.load_snapshot().running_requests == 0
        assert engine.load_snapshot().used_tokens == 0
    assert engine.cancelled_requests == 2


async def test_validation(sim_model: SimModel, fast_config: SimWorkerConfig) -> None:
    engine = make_engine(sim_model, fast_config)
    bad = [
        spec(prompt=()),
        spec(prompt=(1,) * 8193),
        spec(prompt=(1, 128256)),
        spec(max_tokens=0),
        spec(max_tokens=3, min_tokens=4),
        spec(n=0),
    ]
    for request in bad:
        with pytest.raises(InvalidRequestError):
            engine.submit(request)
    held = engine.submit(spec("dup"))
    first = await anext(held)  # registered once it runs
    with pytest.raises(InvalidRequestError, match="already running"):
        engine.submit(spec("dup"))
    assert [first, *await collect(held)][-1].finish is not None
    never_started = engine.submit(spec("idle"))
    await never_started.aclose()
    assert engine.active_requests == 0
    engine.close()
    with pytest.raises(EngineClosedError):
        engine.submit(spec("late"))


async def test_context_window_caps_the_answer(sim_model: SimModel, fast_config: SimWorkerConfig) -> None:
    engine = make_engine(sim_model, fast_config)
    outputs = await collect(engine.submit(spec(prompt=(5,) * 8190, ignore_eos=True)))
    assert outputs[-1].output_tokens == 2
    assert outputs[-1].finish is not None and outputs[-1].finish.reason == "length"


async def test_kv_events_flow_and_flush_clears(sim_model: SimModel, fast_config: SimWorkerConfig) -> None:
    engine = make_engine(sim_model, fast_config, tpot_ms=2)
    received: list[KvBatch] = []

    async def subscribe() -> None:
        async for batch in engine.kv_batches(0):
            received.append(batch)  # noqa: PERF401 - read while the subscription is still open

    subscriber = asyncio.create_task(subscribe())
    running = engine.submit(spec("a", max_tokens=10, ignore_eos=True))
    first = await anext(running)
    assert first.cached_tokens == 0
    assert await engine.flush_cache(0) == (False, "requests are in flight; pass a timeout to wait for them")
    flushing = asyncio.create_task(engine.flush_cache(5))
    await collect(running)
    assert await flushing == (True, "Cache flushed successfully")
    await asyncio.sleep(0)
    events = [numbered.event for batch in received for numbered in batch.events]
    stored = [e for e in events if isinstance(e, BlocksStored)]
    assert stored[0].parent_block_hash is None
    assert [b.token_ids for b in stored[0].blocks] == [PROMPT[:16], PROMPT[16:32]]
    assert len(stored) == 2  # the prompt's blocks, then the block the answer completed
    assert stored[1].parent_block_hash == stored[0].blocks[-1].block_hash
    assert events[-1] == CacheCleared()
    assert [b.sequence_number for b in received] == list(range(1, len(received) + 1))
    engine.close()
    await asyncio.wait_for(subscriber, 1)


async def test_prefill_role_hands_off_kv_params_and_decode_role_skips_prefill(
    sim_model: SimModel, fast_config: SimWorkerConfig
) -> None:
    prefill = make_engine(sim_model, fast_config, role="prefill")
    outputs = await collect(prefill.submit(spec("pd-1", max_tokens=1)))
    params = outputs[-1].kv_transfer_params
    assert params is not None
    assert params["remote_request_id"] == "pd-1"
    assert params["remote_engine_id"] == "sim-h:7"
    assert (params["remote_host"], params["remote_port"]) == ("h", 7)

    decode = make_engine(sim_model, fast_config, role="decode", ttft_per_uncached_token_ms=1.0)
    handed = GenerateSpec("pd-2", tuple(range(3000, 3300)), SamplingSpec(max_tokens=1), dict(params))
    elapsed, _ = await first_output_after(decode, handed)
    assert elapsed < 0.15  # 300 uncached tokens would cost 300 ms without the hand-off
