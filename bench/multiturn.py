"""A multi-turn chat workload with shared system prompts, and the open-loop driver that replays it.

The workload is a pure function of its config, a seed and the Llama-3 tokenizer (used only to size texts):

- ``system_prompts`` distinct system prompts of ``system_tokens`` tokens; the first conversations take one
  each, in order, and every later one takes prompt ``k`` with Zipf weight ``1 / (k + 1) ** system_zipf_s``
  (a few popular prompts, a tail of rare ones);
- conversations start as a Poisson process of rate ``rate_rps / mean_turns`` in ``[0, duration_s)``; each has
  ``turns`` turns, the next scheduled an exponential think time (mean ``think_s``) after the previous one,
  so in steady state requests arrive at ``rate_rps``. Turns scheduled at or after ``duration_s`` are dropped;
- turn ``t`` sends the system prompt, every earlier user message and answer, and a new user message that
  starts with ``Conversation c, turn t.`` (so conversations share the system prompt and nothing else). The
  earlier answers are synthetic texts of ``answer_tokens`` tokens, not what the engine said: the byte-exact
  same requests go to every gateway, whatever it streamed back.

The driver is open loop: each turn is sent at its scheduled time, whatever else is in flight. The one
exception is a conversation's own previous turn: a user reads an answer before typing the next message, so a
turn whose predecessor is still streaming waits for it and is counted as late (``late_s``). Every request
streams and asks for exactly ``answer_tokens`` tokens (``ignore_eos``); the gateway is chosen per request by
a seeded draw among ``urls`` (one URL: every request to it). The conversation id travels as the
``X-SMG-Routing-Key`` header, which consistent_hashing reads on both gateways and the other policies ignore.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp
import msgspec
from tokenizers import Tokenizer

from bench.load import LoadError, run_async, stream_chat
from bench.prompts import sized_text
from bench.report import percentile

ROUTING_KEY_HEADER = "X-SMG-Routing-Key"
# Distinct user messages and answers per workload; each user message also starts with its own turn label.
TEXT_POOL_SIZE = 64
# A turn is late when it goes out more than this after its scheduled time (timer jitter is below it).
LATE_AFTER_S = 0.05
# Error messages kept per run for the report.
KEPT_ERRORS = 5
# A request is a miss when more than this share of its prompt was not cached.
MISS_UNCACHED_SHARE = 0.5
# A request stalled when its TTFT exceeds the engine's own prefill time by more than this: time spent in the
# gateway, in a queue, or descheduled on a busy machine, not in prefill.
STALL_OVERHEAD_MS = 50.0


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    rate_rps: float = 20.0
    duration_s: float = 25.0
    warmup_s: float = 8.0  # turns scheduled before this are sent but not measured
    system_prompts: int = 8
    system_tokens: tuple[int, int] = (1000, 2000)
    system_zipf_s: float = 1.0
    turns: tuple[int, int] = (3, 8)
    user_tokens: tuple[int, int] = (30, 150)
    answer_tokens: int = 32
    think_s: float = 1.5
    seed: int = 0

    def __post_init__(self) -> None:
        if self.rate_rps <= 0 or self.duration_s <= 0 or self.think_s <= 0:
            raise ValueError("rate_rps, duration_s and think_s must be > 0")
        if not 0 <= self.warmup_s < self.duration_s:
            raise ValueError("warmup_s must be in [0, duration_s)")
        for name in ("system_tokens", "turns", "user_tokens"):
            low, high = getattr(self, name)
            if not 1 <= low <= high:
                raise ValueError(f"{name}: need 1 <= low <= high, got {(low, high)}")
        if self.system_prompts < 1 or self.answer_tokens < 1:
            raise ValueError("system_prompts and answer_tokens must be >= 1")

    @property
    def mean_turns(self) -> float:
        return (self.turns[0] + self.turns[1]) / 2


@dataclass(frozen=True, slots=True)
class Turn:
    conversation: int
    index: int
    at_s: float  # scheduled send time, from the start of the run
    user: str
    answer: str  # what the next turn sends back as this turn's answer


@dataclass(frozen=True, slots=True)
class Conversation:
    id: int
    system: int
    turns: tuple[Turn, ...]


@dataclass(frozen=True, slots=True)
class Workload:
    config: WorkloadConfig
    system_texts: tuple[str, ...]
    conversations: tuple[Conversation, ...]

    @property
    def requests(self) -> int:
        return sum(len(c.turns) for c in self.conversations)

    def messages(self, conversation: Conversation, turn: int) -> list[dict[str, str]]:
        """The chat messages of ``conversation``'s turn ``turn``: the system prompt, the history, the question."""
        out = [{"role": "system", "content": self.system_texts[conversation.system]}]
        for earlier in conversation.turns[:turn]:
            out.append({"role": "user", "content": earlier.user})
            out.append({"role": "assistant", "content": earlier.answer})
        out.append({"role": "user", "content": conversation.turns[turn].user})
        return out

    def body(self, model: str, conversation: Conversation, turn: int) -> bytes:
        return msgspec.json.encode(
            {
                "model": model,
                "messages": self.messages(conversation, turn),
                "max_tokens": self.config.answer_tokens,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
        )


def build_workload(config: WorkloadConfig, tokenizer: Tokenizer) -> Workload:
    """The workload of ``config`` (deterministic in ``config.seed``; the tokenizer only sizes the texts)."""
    seed = config.seed
    sizes = random.Random(f"{seed}/system-sizes")
    system_texts = tuple(
        sized_text(tokenizer, random.Random(f"{seed}/system/{k}"), sizes.randint(*config.system_tokens))
        for k in range(config.system_prompts)
    )
    user_sizes = random.Random(f"{seed}/user-sizes")
    users = [
        sized_text(tokenizer, random.Random(f"{seed}/user/{i}"), user_sizes.randint(*config.user_tokens))
        for i in range(TEXT_POOL_SIZE)
    ]
    answers = [
        sized_text(tokenizer, random.Random(f"{seed}/answer/{i}"), config.answer_tokens) for i in range(TEXT_POOL_SIZE)
    ]
    weights = [1.0 / (k + 1) ** config.system_zipf_s for k in range(config.system_prompts)]
    rng = random.Random(f"{seed}/schedule")
    conversation_rate = config.rate_rps / config.mean_turns
    conversations: list[Conversation] = []
    start = 0.0
    for cid in itertools.count():
        start += rng.expovariate(conversation_rate)
        if start >= config.duration_s:
            break
        # The first conversations take each system prompt once, so that all are in use early (a prompt's very
        # first request is a miss under any policy); the rest draw by popularity.
        system = cid if cid < config.system_prompts else rng.choices(range(config.system_prompts), weights)[0]
        count = rng.randint(*config.turns)
        turns: list[Turn] = []
        at = start
        for index in range(count):
            if at >= config.duration_s:
                break
            user = f"Conversation {cid}, turn {index}." + rng.choice(users)
            turns.append(Turn(cid, index, at, user, rng.choice(answers).strip()))
            at += rng.expovariate(1.0 / config.think_s)
        conversations.append(Conversation(cid, system, tuple(turns)))
    return Workload(config=config, system_texts=system_texts, conversations=tuple(conversations))


def target_of(seed: int, conversation: int, turn: int, count: int) -> int:
    """Which of ``count`` gateways a turn goes to: a draw of its own, so it never depends on timing."""
    return 0 if count == 1 else random.Random(f"{seed}/target/{conversation}/{turn}").randrange(count)


# --- the driver ---


@dataclass(frozen=True, slots=True)
class RequestRecord:
    conversation: int
    turn: int
    target: int  # index into the run's URLs
    scheduled_s: float
    sent_s: float
    ttft_s: float  # NaN when the request failed
    latency_s: float  # NaN when the request failed
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    error: str | None = None


@dataclass(frozen=True, slots=True)
class WorkloadResult:
    records: tuple[RequestRecord, ...]
    skipped: int  # turns never sent: the run's deadline passed first
    wall_s: float
    loadgen_cpu_s: float


async def drive_workload(
    workload: Workload, urls: Sequence[str], model: str, request_timeout_s: float, target_seed: int = 0
) -> WorkloadResult:
    """``run_workload`` on the running event loop."""
    config = workload.config
    endpoints = [url.rstrip("/") + "/v1/chat/completions" for url in urls]
    records: list[RequestRecord] = []
    skipped = 0
    loop = asyncio.get_running_loop()
    # No turn starts after this: a gateway that falls far behind ends the run instead of stretching it.
    last_send_s = config.duration_s + request_timeout_s
    cpu0 = time.process_time()
    t0 = loop.time()

    async def conversation(session: aiohttp.ClientSession, conv: Conversation) -> None:
        nonlocal skipped
        previous_end = 0.0
        for index, turn in enumerate(conv.turns):
            due = max(turn.at_s, previous_end)
            if due > last_send_s:
                skipped += len(conv.turns) - index
                return
            delay = t0 + due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            target = target_of(target_seed, conv.id, index, len(urls))
            body = workload.body(model, conv, index)
            sent = loop.time() - t0
            try:
                sample = await stream_chat(
                    session, endpoints[target], body, {ROUTING_KEY_HEADER: f"conversation-{conv.id}"}
                )
            except (LoadError, aiohttp.ClientError, TimeoutError) as exc:
                error = f"{type(exc).__name__}: {exc}"[:300]
                records.append(
                    RequestRecord(conv.id, index, target, turn.at_s, sent, math.nan, math.nan, 0, 0, 0, error)
                )
            else:
                records.append(
                    RequestRecord(
                        conv.id,
                        index,
                        target,
                        turn.at_s,
                        sent,
                        sample.ttft_s,
                        sample.latency_s,
                        sample.prompt_tokens,
                        sample.cached_tokens,
                        sample.completion_tokens,
                    )
                )
            previous_end = loop.time() - t0

    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=request_timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        # Each request is bounded by its own timeout and no turn starts after last_send_s: this bounds the run.
        await asyncio.wait_for(
            asyncio.gather(*(conversation(session, c) for c in workload.conversations)),
            last_send_s + request_timeout_s + 5.0,
        )
    records.sort(key=lambda r: (r.scheduled_s, r.conversation))
    return WorkloadResult(
        records=tuple(records),
        skipped=skipped,
        wall_s=loop.time() - t0,
        loadgen_cpu_s=time.process_time() - cpu0,
    )


def run_workload(
    workload: Workload, urls: Sequence[str], model: str, *, request_timeout_s: float = 60.0, target_seed: int = 0
) -> WorkloadResult:
    """Replay ``workload`` against the gateways at ``urls`` (each turn to a seeded random one of them).

    Failed requests are recorded, not raised; the run lasts about ``duration_s`` plus the last answers.
    """
    if not urls:
        raise ValueError("at least one gateway URL is needed")
    return run_async(lambda: drive_workload(workload, urls, model, request_timeout_s, target_seed))


# --- what a run measured ---


@dataclass(frozen=True, slots=True)
class RunStats:
    """One run's measured window (turns scheduled from ``warmup_s`` on); all fields numbers, so repetitions
    take a field-by-field median (``report.median_fields``)."""

    requests: float  # answered
    errors: float
    late: float  # sent more than LATE_AFTER_S after their scheduled time
    skipped: float  # never sent (whole run)
    req_s: float  # answered per second of the measured window
    prompt_tokens: float  # mean usage.prompt_tokens
    hit_ratio: float  # sum of usage.prompt_tokens_details.cached_tokens / sum of usage.prompt_tokens
    ttft_p50_ms: float
    ttft_p90_ms: float
    ttft_p99_ms: float
    latency_p50_ms: float
    latency_p99_ms: float
    misses: float  # answered with more than MISS_UNCACHED_SHARE of the prompt uncached
    stalls: float  # answered with a TTFT overhead above STALL_OVERHEAD_MS
    overhead_p50_ms: float  # TTFT minus the engine's prefill time for the uncached tokens (NaN: model unknown)
    overhead_p99_ms: float
    gateway_cpu_ms_per_req: float  # the gateway process trees' CPU over the whole run / answered requests
    loadgen_cpu_pct: float
    other_cpu_pct: float  # every other process on the machine over the run, % of one core


def run_stats(
    result: WorkloadResult,
    config: WorkloadConfig,
    *,
    gateway_cpu_s: float = math.nan,
    other_cpu_s: float = math.nan,
    prefill_ms: Callable[[int], float] | None = None,
) -> RunStats:
    """The measured window's numbers; ``prefill_ms(uncached_tokens)`` is the engine's own TTFT (its latency
    model), which splits each TTFT into prefill and overhead."""
    measured = [r for r in result.records if r.scheduled_s >= config.warmup_s]
    ok = [r for r in measured if r.error is None]
    answered = sum(1 for r in result.records if r.error is None)
    prompt = sum(r.prompt_tokens for r in ok)
    ttft = [r.ttft_s * 1000 for r in ok]
    latency = [r.latency_s * 1000 for r in ok]
    uncached = [r.prompt_tokens - r.cached_tokens for r in ok]
    overhead = [t - prefill_ms(u) for t, u in zip(ttft, uncached, strict=True)] if prefill_ms is not None else []
    wall = result.wall_s
    return RunStats(
        requests=len(ok),
        errors=len(measured) - len(ok),
        late=sum(1 for r in measured if r.sent_s - r.scheduled_s > LATE_AFTER_S),
        skipped=result.skipped,
        req_s=len(ok) / (config.duration_s - config.warmup_s),
        prompt_tokens=statistics.fmean(r.prompt_tokens for r in ok) if ok else math.nan,
        hit_ratio=sum(r.cached_tokens for r in ok) / prompt if prompt else math.nan,
        ttft_p50_ms=percentile(ttft, 50),
        ttft_p90_ms=percentile(ttft, 90),
        ttft_p99_ms=percentile(ttft, 99),
        latency_p50_ms=percentile(latency, 50),
        latency_p99_ms=percentile(latency, 99),
        misses=sum(1 for r, u in zip(ok, uncached, strict=True) if u > MISS_UNCACHED_SHARE * r.prompt_tokens),
        stalls=sum(1 for o in overhead if o > STALL_OVERHEAD_MS) if prefill_ms is not None else math.nan,
        overhead_p50_ms=percentile(overhead, 50),
        overhead_p99_ms=percentile(overhead, 99),
        gateway_cpu_ms_per_req=1000.0 * gateway_cpu_s / answered if answered else math.nan,
        loadgen_cpu_pct=100.0 * result.loadgen_cpu_s / wall if wall > 0 else math.nan,
        other_cpu_pct=100.0 * other_cpu_s / wall if wall > 0 else math.nan,
    )


def first_errors(result: WorkloadResult) -> tuple[str, ...]:
    """The first few distinct error messages of a run."""
    seen: list[str] = []
    for record in result.records:
        if record.error is not None and record.error not in seen:
            seen.append(record.error)
            if len(seen) == KEPT_ERRORS:
                break
    return tuple(seen)


def write_records(path: Path, result: WorkloadResult) -> None:
    """Every request of a run as JSON lines (for looking into a run after the fact)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        for record in result.records:
            row = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in asdict(record).items()}
            out.write(json.dumps(row) + "\n")
