"""The multi-turn workload (pure) and its open-loop driver against an in-process fake gateway."""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from tokenizers import Tokenizer

from bench.multiturn import (
    LATE_AFTER_S,
    ROUTING_KEY_HEADER,
    RequestRecord,
    WorkloadConfig,
    WorkloadResult,
    build_workload,
    drive_workload,
    run_stats,
    target_of,
)
from bench.prompts import load_tokenizer

SMALL = WorkloadConfig(
    rate_rps=20.0,
    duration_s=6.0,
    warmup_s=1.0,
    system_prompts=3,
    system_tokens=(200, 300),
    turns=(2, 4),
    user_tokens=(10, 30),
    answer_tokens=8,
    think_s=0.5,
)


@pytest.fixture(scope="module")
def tokenizer(llama3_model_dir: Path) -> Tokenizer:
    return load_tokenizer(llama3_model_dir)


def test_the_workload_is_a_function_of_its_seed(tokenizer: Tokenizer) -> None:
    a = build_workload(SMALL, tokenizer)
    assert build_workload(SMALL, tokenizer) == a
    assert build_workload(replace(SMALL, seed=1), tokenizer) != a


def test_turns_grow_the_conversation_and_share_only_the_system_prompt(tokenizer: Tokenizer) -> None:
    workload = build_workload(SMALL, tokenizer)
    assert len(workload.conversations) > 10
    # The first conversations take every system prompt once: none is first seen late in a run.
    assert [c.system for c in workload.conversations[: SMALL.system_prompts]] == list(range(SMALL.system_prompts))
    users = set()
    for conversation in workload.conversations:
        previous: list[dict[str, str]] = []
        for index, turn in enumerate(conversation.turns):
            assert 0 <= turn.at_s < SMALL.duration_s
            messages = workload.messages(conversation, index)
            assert messages[0] == {"role": "system", "content": workload.system_texts[conversation.system]}
            assert messages[: len(previous)] == previous  # each turn extends the one before
            assert messages[-1]["content"].startswith(f"Conversation {conversation.id}, turn {index}.")
            previous = [*messages, {"role": "assistant", "content": turn.answer}]
            users.add(messages[-1]["content"])
        times = [t.at_s for t in conversation.turns]
        assert times == sorted(times)
    assert len(users) == workload.requests  # no two requests alike beyond the system prompt
    body = json.loads(workload.body("llama3", workload.conversations[0], 0))
    assert body["max_tokens"] == SMALL.answer_tokens
    assert body["ignore_eos"] is True
    assert body["stream_options"] == {"include_usage": True}


def test_system_prompts_are_sized_and_requests_arrive_at_about_the_rate(tokenizer: Tokenizer) -> None:
    config = replace(SMALL, duration_s=200.0, think_s=1.0)
    workload = build_workload(config, tokenizer)
    for text in workload.system_texts:
        assert 150 <= len(tokenizer.encode(text, add_special_tokens=False).ids) <= 300
    # Steady state (after the first conversations' span) runs at rate_rps.
    late = sum(1 for c in workload.conversations for t in c.turns if t.at_s >= 20.0)
    assert late / 180.0 == pytest.approx(config.rate_rps, rel=0.15)
    popular = Counter(c.system for c in workload.conversations)
    assert popular[0] > popular[1] > popular[2]  # Zipf


def test_each_turn_has_its_own_gateway_draw() -> None:
    assert all(target_of(0, c, t, 1) == 0 for c in range(5) for t in range(5))
    draws = [target_of(0, c, t, 3) for c in range(100) for t in range(6)]
    assert draws == [target_of(0, c, t, 3) for c in range(100) for t in range(6)]
    assert all(160 <= n <= 240 for n in Counter(draws).values())


def _record(at: float, *, sent: float | None = None, error: str | None = None, cached: int = 50) -> RequestRecord:
    ok = error is None
    return RequestRecord(
        conversation=0,
        turn=0,
        target=0,
        scheduled_s=at,
        sent_s=at if sent is None else sent,
        ttft_s=0.010 if ok else math.nan,
        latency_s=0.100 if ok else math.nan,
        prompt_tokens=100 if ok else 0,
        cached_tokens=cached if ok else 0,
        completion_tokens=8 if ok else 0,
        error=error,
    )


def test_stats_cover_the_measured_window_only() -> None:
    records = (
        _record(0.5, cached=0),  # warm-up: not measured
        _record(1.5, cached=90),
        _record(2.0, cached=10, sent=2.0 + 2 * LATE_AFTER_S),
        _record(3.0, error="LoadError: HTTP 503"),
    )
    stats = run_stats(
        WorkloadResult(records, 1, 6.0, 0.6),
        SMALL,
        gateway_cpu_s=0.3,
        other_cpu_s=1.2,
        prefill_ms=lambda uncached: uncached / 10,  # 1 and 9 ms: 9 and 1 ms of overhead
    )
    assert (stats.requests, stats.errors, stats.late, stats.skipped) == (2, 1, 1, 1)
    assert (stats.misses, stats.stalls) == (1, 0)  # 90 of 100 tokens uncached is a miss
    assert (stats.overhead_p50_ms, stats.overhead_p99_ms) == (pytest.approx(1.0), pytest.approx(9.0))
    assert stats.hit_ratio == pytest.approx(0.5)
    assert stats.req_s == pytest.approx(2 / 5.0)
    assert stats.ttft_p99_ms == pytest.approx(10.0)
    assert stats.gateway_cpu_ms_per_req == pytest.approx(100.0)  # 0.3 s over the 3 answered requests
    assert stats.loadgen_cpu_pct == pytest.approx(10.0)
    assert stats.other_cpu_pct == pytest.approx(20.0)


async def test_the_driver_replays_turns_open_loop_with_routing_keys(tokenizer: Tokenizer) -> None:
    config = replace(SMALL, duration_s=1.5, warmup_s=0.0, rate_rps=30.0, think_s=0.1)
    workload = build_workload(config, tokenizer)
    seen: list[tuple[str, int]] = []

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen.append((request.headers[ROUTING_KEY_HEADER], len(body["messages"])))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        usage = {"prompt_tokens": 100, "completion_tokens": 8, "prompt_tokens_details": {"cached_tokens": 60}}
        for event in (
            {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
            {"choices": [{"index": 0, "delta": {"content": " hello"}}]},
            {"choices": [], "usage": usage},
        ):
            await response.write(b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    async with TestServer(app) as server:
        url = str(server.make_url("/"))
        result = await drive_workload(workload, [url, url], "llama3", request_timeout_s=5.0)
    assert len(result.records) == workload.requests == len(seen)
    assert result.skipped == 0
    assert all(r.error is None for r in result.records), [r.error for r in result.records][:3]
    assert {r.cached_tokens for r in result.records} == {60}
    assert {r.target for r in result.records} == {0, 1}
    # Turn t of a conversation carries 1 + 2t + 1 messages, under the conversation's key.
    turns = {(r.conversation, r.turn) for r in result.records}
    assert Counter(seen) == Counter((f"conversation-{c}", 2 + 2 * t) for c, t in turns)
    for r in result.records:
        assert r.sent_s >= r.scheduled_s - 0.01
        assert 0 < r.ttft_s <= r.latency_s
