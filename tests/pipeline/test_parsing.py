"""Parser choice per model and the Output stage's helpers for parsers: kept special-token delimiters,
reasoning tokens counted by id, per-model configuration."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from node.config import ModelConfig
from node.pipeline.events import ContentDelta, ReasoningDelta, ToolCallDelta
from node.pipeline.output import OutputProcessor
from node.pipeline.parser_stage import parser_stages
from node.pipeline.parsers.registry import UnknownParserError
from node.pipeline.parsing import KeepingDetokenizer, ParserPlan, ThinkCounter, resolve_parsers
from node.pipeline.request import NamedTool
from node.pipeline.served_model import load_served_model
from node.pipeline.spec import GenerateSpec
from node.pipeline.tokenizer import Tokenizer
from node.workers.types import SamplingParams, WorkerOutput


def test_names_resolve_auto_none_or_as_given(llama3_tokenizer: Tokenizer) -> None:
    def resolve(tool: str, reasoning: str) -> tuple[str | None, str | None]:
        p = resolve_parsers(
            llama3_tokenizer, tool=tool, reasoning=reasoning, detected_tool="llama3_json", detected_reasoning=None
        )
        return p.tool_parser, p.reasoning_parser

    assert resolve("auto", "auto") == ("llama3_json", None)
    assert resolve("none", "qwen3") == (None, "qwen3")
    assert resolve("hermes", "none") == ("hermes", None)
    with pytest.raises(UnknownParserError, match="unknown tool-call parser 'hermes2'"):
        resolve("hermes2", "auto")
    with pytest.raises(UnknownParserError, match="reasoning parser"):
        resolve("auto", "think")


def test_special_delimiters_are_kept_and_other_specials_still_skipped(llama3_tokenizer: Tokenizer) -> None:
    tok = llama3_tokenizer
    start, end = tok.token_to_id("<|start_header_id|>"), tok.token_to_id("<|end_header_id|>")
    assert start is not None and end is not None and {start, end} <= tok.special_token_ids
    ids = [start, *tok.encode("tool", add_special_tokens=False), end]
    assert tok.decode(ids, skip_special_tokens=True) == "tool", "the client's skip would drop the delimiter"
    detok = KeepingDetokenizer(tok, frozenset({start}))
    text = "".join(detok.step([t]) for t in ids) + detok.finish()
    assert text == "<|start_header_id|>tool"


@given(st.lists(st.sampled_from([1, 2, 3, 7, 8]), max_size=30), st.booleans(), st.data())
def test_reasoning_tokens_count_the_same_for_any_chunking(ids: list[int], opened: bool, data: st.DataObject) -> None:
    # 7 = <think>, 8 = </think>: the ids strictly inside the block count.
    whole = ThinkCounter((7, 8), in_reasoning=opened)
    whole.feed(ids)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(ids)), max_size=5)))
    pieces = [ids[a:b] for a, b in zip([0, *cuts], [*cuts, len(ids)], strict=True)]
    chunked = ThinkCounter((7, 8), in_reasoning=opened)
    for piece in pieces:
        chunked.feed(piece)
    assert chunked.count == whole.count
    if not opened and ids[:1] == [7] and 8 in ids:
        assert whole.count == ids.index(8) - 1


def test_per_model_parser_overrides() -> None:
    config = ModelConfig(
        model_path=("/m/qwen", "/m/llama"),
        tool_call_parser="none",
        model_tool_call_parser=("qwen=hermes",),
        model_reasoning_parser=("/m/llama=none",),
    )
    assert config.parsers_for(frozenset({"/m/qwen", "qwen"})) == ("hermes", "auto")
    assert config.parsers_for(frozenset({"/m/llama", "llama"})) == ("none", "none")
    with pytest.raises(ValueError, match="expected MODEL=NAME"):
        ModelConfig(model_path=("/m/qwen",), model_tool_call_parser=("hermes",))
    with pytest.raises(ValueError, match="given twice"):
        ModelConfig(model_path=("/m/qwen",), model_tool_call_parser=("qwen=hermes", "qwen=mistral"))


def test_a_forced_call_after_reasoning_through_the_output_stage(qwen_model_dir: Path) -> None:
    """tool_choice named, constrained engine: a thinking model's reasoning, then the bare arguments JSON."""
    model = load_served_model(str(qwen_model_dir), served_name="qwen")
    tok = model.tokenizer
    p = model.parsers
    plan = ParserPlan(
        tool_parser=p.tool_parser,
        reasoning_parser=p.reasoning_parser,
        tools={"get_weather": {}},
        keep_ids=p.keep_ids,
        think_ids=p.think_ids,
        forced=NamedTool("get_weather"),
    )
    ids = [
        *tok.encode('<think>\nhm\n</think>\n\n{"city": "Paris"}', add_special_tokens=False),
        min(model.eos_token_ids),
    ]
    spec = GenerateSpec(request_id="chatcmpl-abc", prompt_ids=[1], params=SamplingParams(max_tokens=100), parsing=plan)
    out = OutputProcessor(spec, tok, stages=parser_stages)
    events = [e for k in range(len(ids)) for e in out.feed([WorkerOutput(0, ids[k : k + 1], 1, k + 1, 0, None)])]
    assert "".join(e.text for e in events if isinstance(e, ReasoningDelta)) == "\nhm\n"
    calls = [e for e in events if isinstance(e, ToolCallDelta)]
    assert calls[0].name == "get_weather" and "".join(c.arguments for c in calls) == '{"city": "Paris"}'
    assert not [e for e in events if isinstance(e, ContentDelta) and e.text]
    assert out.usage.reasoning_tokens == len(tok.encode("\nhm\n", add_special_tokens=False))


def test_an_override_naming_no_served_model_refuses_to_start() -> None:
    from node.app import _check_parser_overrides

    config = ModelConfig(model_path=("/m/qwen",), model_reasoning_parser=("qwen2=none",))
    with pytest.raises(ValueError, match="no --model-path is known as 'qwen2'"):
        _check_parser_overrides(config, [frozenset({"/m/qwen", "qwen"})])
    _check_parser_overrides(replace(config, model_reasoning_parser=("qwen=none",)), [frozenset({"/m/qwen", "qwen"})])
