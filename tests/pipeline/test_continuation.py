"""The continue step, pure: the continuation's prompt and params, and the Output stage's pause and resume at a
reasoning budget (no worker, no loop)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from node.pipeline.continuation import continuation_spec, room_to_continue
from node.pipeline.events import ContentDelta, Event, Finish, ReasoningDelta
from node.pipeline.output import OutputProcessor
from node.pipeline.parser_stage import parser_stages
from node.pipeline.parsers.registry import REASONING_CLOSE, REASONING_PARSERS
from node.pipeline.parsing import ParserPlan
from node.pipeline.served_model import ServedModel, load_served_model
from node.pipeline.spec import GenerateSpec
from node.workers.types import SamplingParams, WorkerOutput


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
