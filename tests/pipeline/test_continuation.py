"""The continue step: the continuation's prompt and params and the Output stage's pause and resume at a
reasoning budget (pure), then Dispatch running it against in-memory workers (retry, client disconnect)."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from node.pipeline.context import RequestContext
from node.pipeline.continuation import continuation_spec, room_to_continue
from node.pipeline.cpu import CpuPool
from node.pipeline.events import ContentDelta, Event, Finish, ReasoningDelta
from node.pipeline.output import OutputProcessor
from node.pipeline.parser_stage import parser_stages
from node.pipeline.parsers.registry import REASONING_CLOSE, REASONING_PARSERS
from node.pipeline.parsing import ParserPlan
from node.pipeline.pipeline import Pipeline
from node.pipeline.request import ChatPrompt, GenerateRequest, Sampling
from node.pipeline.served_model import ServedModel, load_served_model
from node.pipeline.spec import GenerateSpec
from node.tasks import Supervisor
from node.workers.client import WorkerUnavailable
from node.workers.memory import MemoryWorker, Reply, memory_pool
from node.workers.types import SamplingParams, WorkerOutput, WorkerRequest


@pytest.fixture(scope="module")
def qwen(qwen_model_dir: Path) -> ServedModel:
    return load_served_model(str(qwen_model_dir), served_name="qwen")


def test_the_continuation_prompt_is_the_prompt_then_what_was_produced() -> None:
    spec = GenerateSpec(
        request_id="msg_1", prompt_ids=[1, 2, 3], params=SamplingParams(max_tokens=100, min_tokens=10, seed=7)
    )
    produced = [50, 51, 52, 90, 91]  # the model's ids, then the gateway's close
    cont = continuation_spec(spec, produced, 1)
    assert list(cont.prompt_ids) == [1, 2, 3, 50, 51, 52, 90, 91]
    assert cont.params.max_tokens == 95 and cont.params.min_tokens == 5 and cont.params.seed == 7
    assert cont.request_id == "msg_1-c1" and continuation_spec(spec, produced, 2).request_id == "msg_1-c2"
    assert list(spec.prompt_ids) == [1, 2, 3], "the original spec is left as it was"
    assert continuation_spec(spec, [1] * 99, 1).params.max_tokens == 1
    with pytest.raises(ValueError, match="leave none"):
        continuation_spec(spec, [1] * 100, 1)
    with pytest.raises(ValueError, match="one choice"):
        continuation_spec(replace(spec, params=SamplingParams(max_tokens=100, n=2)), produced, 1)
    assert room_to_continue(10, 7, 2) and not room_to_continue(10, 8, 2)


def test_every_think_family_closes_its_block() -> None:
    """Each reasoning format of the think family has a close starting with </think> (Harmony has none)."""
    assert set(REASONING_CLOSE) == REASONING_PARSERS - {"gpt_oss"}
    assert all(text.startswith("</think>") for text in REASONING_CLOSE.values())


def _plan(model: ServedModel, budget: int) -> ParserPlan:
    p = model.parsers
    return ParserPlan(
        tool_parser=None,
        reasoning_parser=p.reasoning_parser,
        keep_ids=p.keep_ids,
        think_ids=p.think_ids,
        think_budget=budget,
        think_close_ids=p.think_close_ids,
    )


def test_the_output_stage_pauses_at_the_budget_and_resumes_with_the_close(qwen: ServedModel) -> None:
    tok = qwen.tokenizer
    close = qwen.parsers.think_close_ids
    assert tok.decode(close, skip_special_tokens=False) == "</think>\n\n"
    spec = GenerateSpec(
        request_id="msg_1", prompt_ids=[1, 2], params=SamplingParams(max_tokens=50), parsing=_plan(qwen, 4)
    )
    out = OutputProcessor(spec, tok, stages=parser_stages)
    assert out.worker_streams, "a budget is acted on when reached: the worker streams even for a JSON answer"
    thought = tok.encode("<think>a b c d e f g h</think>\n\nno", add_special_tokens=False)
    # The whole thought in one message: the choice pauses on the 4th reasoning token, the rest is not read.
    events = out.feed([WorkerOutput(0, thought, 2, len(thought), 0, None)])
    assert out.paused and not out.complete and out.usage.completion_tokens == 1 + 4
    assert not [e for e in events if isinstance(e, Finish)]
    resumed, produced = out.resume()
    assert not out.paused and produced == (*thought[:5], *close)
    events += resumed
    assert "".join(e.text for e in events if isinstance(e, ReasoningDelta)) == "a b c d"
    assert out.usage.reasoning_tokens == 4 and out.usage.completion_tokens == 1 + 4 + len(close)
    # The continuation's stream: its answer and finish, counted after what came before.
    answer = tok.encode("Yes.", add_special_tokens=False)
    events += out.feed([WorkerOutput(0, [*answer, min(qwen.eos_token_ids)], 9, len(answer) + 1, 9, "stop")])
    assert out.complete and out.worker_done
    assert "".join(e.text for e in events if isinstance(e, ContentDelta)).strip() == "Yes."
    assert events[-1] == Finish(0, "stop", None)
    assert out.usage.completion_tokens == 1 + 4 + len(close) + len(answer) + 1
    assert out.usage.cached_tokens == 0, "the continuation's cache reads are not the client's prompt's"


def test_no_room_or_many_choices_end_at_the_budget(qwen: ServedModel) -> None:
    tok = qwen.tokenizer
    thought = tok.encode("<think>a b c d e f g h</think>\n\nno", add_special_tokens=False)

    def run(max_tokens: int, n: int) -> tuple[OutputProcessor, list[Event]]:
        params = SamplingParams(max_tokens=max_tokens, n=n)
        spec = GenerateSpec(request_id="m", prompt_ids=[1], params=params, parsing=_plan(qwen, 4))
        out = OutputProcessor(spec, tok, stages=parser_stages)
        return out, out.feed([WorkerOutput(k, thought, 1, len(thought), 0, None) for k in range(n)])

    # <think>, 4 reasoning tokens and the 2-id close leave the model no token of its own under max_tokens=7.
    out, events = run(7, 1)
    assert out.complete and not out.paused and events[-1] == Finish(0, "length", None)
    out, _ = run(8, 1)
    assert out.paused
    # Two choices share one worker stream: neither can be continued alone, both end at the budget.
    out, events = run(50, 2)
    assert out.complete and [e for e in events if isinstance(e, Finish)] == [
        Finish(0, "length", None),
        Finish(1, "length", None),
    ]


# --- Dispatch: the continue step against in-memory workers ------------------------------------------------


def _thinking_reply(model: ServedModel, thought: str, body: str) -> Reply:
    """A Qwen3 that thinks then answers; after a block the gateway closed, it answers at once."""
    tok, close = model.tokenizer, list(model.parsers.think_close_ids)
    end = min(model.eos_token_ids)
    full = [*tok.encode(f"<think>\n{thought}\n</think>\n\n{body}", add_special_tokens=False), end]
    answer = [*tok.encode(body, add_special_tokens=False), end]
    return lambda r: [answer if list(r.prompt_ids[-len(close) :]) == close else full] * r.params.n


@dataclass(eq=False)
class _FailsContinuations(MemoryWorker):
    """Unreachable for continuations only: the first stream runs, the continue step has to go elsewhere."""

    async def generate(self, request: WorkerRequest) -> AsyncGenerator[WorkerOutput, None]:
        if request.request_id.endswith("-c1"):
            self.requests.append(request)
            raise WorkerUnavailable("connection refused")
        async for out in super().generate(request):
            yield out


def _budgeted(budget: int, max_tokens: int = 200) -> GenerateRequest:
    prompt = ChatPrompt(messages=[{"role": "user", "content": "Weather?"}])
    sampling = Sampling(max_tokens=max_tokens)
    return GenerateRequest(model="qwen", prompts=(prompt,), sampling=sampling, stream=True, reasoning_budget=budget)


@contextlib.asynccontextmanager
async def _pipeline(model: ServedModel, *workers: MemoryWorker) -> AsyncIterator[Pipeline]:
    cpu = CpuPool(threads=1)
    try:
        async with Supervisor() as sup:
            yield Pipeline(models=[model], pool=memory_pool(workers, supervisor=sup), cpu=cpu, rng=random.Random(7))
            await asyncio.sleep(0)  # let abort tasks run before the supervisor closes
    finally:
        cpu.close()


async def test_a_continuation_that_fails_before_its_first_token_is_retried_elsewhere(qwen: ServedModel) -> None:
    reply = _thinking_reply(qwen, " ".join(["hm"] * 40), "Sunny.")
    up = MemoryWorker("grpc://up:1", reply=reply, chunk_tokens=4)
    flaky = _FailsContinuations("grpc://flaky:1", reply=reply, chunk_tokens=4)
    async with _pipeline(qwen, up, flaky) as pipeline:
        for rid in ("r1", "r2"):  # round robin: one of the two continuations is sent to the flaky worker first
            ctx = RequestContext(request_id=rid)
            run = pipeline.run(await pipeline.prepare(_budgeted(6), qwen, ctx, request_id=rid), ctx)
            batches = [b async for b in run.events()]
            events = [e for b in batches for e in b]
            assert "".join(e.text for e in events if isinstance(e, ReasoningDelta)) == "\n" + " ".join(["hm"] * 5)
            assert "".join(e.text for e in events if isinstance(e, ContentDelta)).strip() == "Sunny."
            assert [e for e in events if isinstance(e, Finish)] == [Finish(0, "stop", None)]
            assert (
                run.usage.completion_tokens
                == 1 + 6 + 2 + len(qwen.tokenizer.encode("Sunny.", add_special_tokens=False)) + 1
            )
    assert [r.request_id for r in flaky.requests if r.request_id.endswith("-c1")], "a continuation met the fault"


async def test_a_client_leaving_during_the_continuation_aborts_it(qwen: ServedModel) -> None:
    worker = MemoryWorker("grpc://w:1", reply=_thinking_reply(qwen, "a b c d e f", "one two three four five"))
    ctx = RequestContext(request_id="c")
    async with _pipeline(qwen, worker) as pipeline:
        run = pipeline.run(await pipeline.prepare(_budgeted(3), qwen, ctx, request_id="r9"), ctx)
        async with contextlib.aclosing(run.events()) as events:
            async for batch in events:
                if any(isinstance(e, ContentDelta) and e.text.strip() for e in batch):
                    break  # the continuation's first answer token: the client goes
    assert [r.request_id for r in worker.requests] == ["r9", "r9-c1"]
    assert worker.aborted == ["r9", "r9-c1"], "the stream cut at the budget, then the continuation"
