"""The simulated engine answers like the model family: constrained output that satisfies its constraint, tool
calls in the family's exact markup (read back by the gateway's own parsers), reasoning when the family thinks."""

from __future__ import annotations

import functools
import json
import random
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from smg_grpc_proto.generated import vllm_engine_pb2 as pb

from node.pipeline.parsers.detect import detect_folder
from node.pipeline.parsers.events import ContentDelta, ReasoningDelta
from node.pipeline.served_model import load_served_model
from node.sim.answers import FamilyAnswers, constrained_text, tools_in_text
from node.sim.errors import InvalidRequestError
from node.sim.grammar_sample import GrammarUnsupported, sample_grammar
from node.sim.json_instance import sample_schema
from node.sim.regex_sample import sample_regex
from node.sim.token_generator import EosPolicy, Prose, SamplingSpec, TokenStream
from node.sim.vocabulary import TextVocabulary
from node.sim.wire import sampling_spec
from node.structured.constraint import Constraint
from tests.pipeline.parsers._run import calls, run, tools
from tests.sim._schema_check import errors

PATTERNS = [
    r"[0-9]{3}",
    r"yes|no",
    r"[A-Z][a-z]{2,8} \d{1,2}(st|nd|rd|th)?",
    r"\w+@\w+\.(com|org)",
    r"(ab|c)*d+",
    r"[^\n,]{4}",
    r"^-?(0|[1-9][0-9]*)(\.[0-9]+)?$",
]
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"type": "string", "enum": ["c", "f"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
SCHEMAS: list[dict[str, Any]] = [
    WEATHER,
    {
        "type": "object",
        "properties": {
            "id": {"type": "string", "pattern": "[a-f0-9]{8}"},
            "score": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 3},
            "owner": {"$ref": "#/$defs/person"},
            "note": {"anyOf": [{"type": "null"}, {"type": "string", "minLength": 3, "maxLength": 5}]},
            "step": {"type": "integer", "multipleOf": 5, "minimum": 3, "maximum": 40},
        },
        "required": ["id", "score", "tags", "owner", "note", "step"],
        "$defs": {
            "person": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
                "required": ["name", "age"],
            }
        },
    },
    {"type": "array", "items": {"type": "boolean"}, "minItems": 2, "maxItems": 2},
]
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather in a city", "parameters": WEATHER},
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
        },
    },
]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32), pattern=st.sampled_from(PATTERNS))
def test_regex_samples_match_the_whole_pattern(seed: int, pattern: str) -> None:
    assert re.fullmatch(pattern, sample_regex(pattern, random.Random(seed))) is not None


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32), schema=st.sampled_from(SCHEMAS))
def test_schema_instances_validate(seed: int, schema: dict[str, Any]) -> None:
    value = sample_schema(schema, random.Random(seed), ("alpha", "bravo"))
    assert errors(value, schema) == []


def test_grammar_samples_stay_in_the_language() -> None:
    rng = random.Random(5)
    assert {sample_grammar('root ::= "yes" | "no"', rng) for _ in range(40)} == {"yes", "no"}
    grammar = 'root ::= greeting " " name  # a comment\ngreeting ::= ("hi" | "hello")\nname ::= [A-Z] [a-z]+'
    for _ in range(20):
        assert re.fullmatch(r"(hi|hello) [A-Z][a-z]+", sample_grammar(grammar, rng))
    with pytest.raises(GrammarUnsupported):
        sample_grammar("start: 'a'", rng)  # Lark: the simulator writes prose instead


def test_constrained_text_satisfies_each_kind() -> None:
    rng = random.Random(1)
    assert constrained_text(Constraint("choice", choices=("red", "blue")), rng) in ("red", "blue")
    assert re.fullmatch("[0-9]{3}", constrained_text(Constraint("regex", "[0-9]{3}"), rng) or "")
    value = json.loads(constrained_text(Constraint("json_schema", json.dumps(WEATHER)), rng) or "")
    assert errors(value, WEATHER) == []
    obj = json.loads(constrained_text(Constraint("json_object"), rng, ("word",)) or "")
    assert isinstance(obj, dict) and obj
    assert constrained_text(Constraint("structural_tag", "{}"), rng) is None


@functools.cache  # loading a 128k-151k vocabulary twice takes seconds: once per folder per session
def _family(model_dir: Path) -> tuple[FamilyAnswers, Any]:
    served = load_served_model(str(model_dir), served_name="m")
    family = detect_folder(model_dir)
    answers = FamilyAnswers(
        served.tokenizer.raw, tool_parser=family.tool_parser, thinks=family.reasoning_parser is not None
    )
    return answers, served


def _prompt(served: Any, messages: list[dict[str, Any]], **extra: Any) -> list[int]:
    text = served.template.render(messages, tools=TOOLS, add_generation_prompt=True, extra=extra or None)
    return list(served.tokenizer.encode(text, add_special_tokens=False))


def _text(family: FamilyAnswers, served: Any, script: tuple[Any, ...] | None) -> str:
    assert script is not None
    ids: list[int] = []
    for segment in script:
        ids += [served.tokenizer.token_to_id("the") or 0] * 3 if isinstance(segment, Prose) else list(segment)
    return str(served.tokenizer.decode(ids, skip_special_tokens=False))


@pytest.mark.parametrize("family_name", ["llama3", "qwen", "deepseek"])
def test_tool_calls_in_the_family_format_parse_back(family_name: str, request: pytest.FixtureRequest) -> None:
    model_dir: Path = request.getfixturevalue(f"{family_name}_model_dir")
    family, served = _family(model_dir)
    parser = family.tool_parser
    assert parser is not None
    prompt = _prompt(served, [{"role": "user", "content": "Weather in Paris?"}], enable_thinking=False)
    facts = family.facts(prompt)
    assert [t.name for t in facts.tools] == ["get_weather", "search"]
    assert not facts.after_tool_result
    counts: list[int] = []
    for seed in range(40):
        script = family.script(prompt, None, seed, mean_length=5)
        if script is None or all(isinstance(s, Prose) for s in script[-1:]):
            counts.append(0)  # plain text under auto
            continue
        text = _text(family, served, script)
        found = calls(run(tools(parser)(), [text]))
        assert found, f"{parser} did not parse the sim's call: {text!r}"
        for name, arguments in found:
            assert errors(json.loads(arguments), PARAMS[name]) == []
        counts.append(len(found))
    assert 0 in counts and 1 in counts and max(counts) >= 2, counts
    assert family.script(prompt, None, 7, mean_length=5) == family.script(prompt, None, 7, mean_length=5)


@pytest.mark.parametrize("family_name", ["llama3", "qwen", "deepseek"])
def test_after_a_tool_result_the_answer_is_text(family_name: str, request: pytest.FixtureRequest) -> None:
    model_dir: Path = request.getfixturevalue(f"{family_name}_model_dir")
    family, served = _family(model_dir)
    call = {"id": "c1", "type": "function", "function": {"name": "search", "arguments": {"q": "x"}}}
    messages = [
        {"role": "user", "content": "Look it up"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
    ]
    prompt = _prompt(served, messages, enable_thinking=False)
    assert family.facts(prompt).after_tool_result
    for seed in range(10):
        script = family.script(prompt, None, seed, mean_length=5)
        assert script is None or isinstance(script[-1], Prose)


def test_qwen_thinks_unless_the_prompt_turns_it_off(qwen_model_dir: Path) -> None:
    family, served = _family(qwen_model_dir)
    messages = [{"role": "user", "content": "hi"}]
    thinking = family.facts(_prompt(served, messages)).thinking
    assert thinking in ("model", "open")
    text = _text(family, served, family.script(_prompt(served, messages), None, 3, mean_length=5))
    assert "</think>" in text
    events = run(tools("hermes", "qwen3")(), [text.removeprefix("<think>")] if thinking == "open" else [text])
    assert any(isinstance(e, ReasoningDelta) for e in events)
    assert any(isinstance(e, ContentDelta) for e in events) or calls(events)
    off = _prompt(served, messages, enable_thinking=False)
    assert family.facts(off).thinking == "off"
    script = family.script(off, None, 3, mean_length=5)
    assert script is None or "<think>" not in _text(family, served, script)


def test_llama3_never_thinks_and_reads_tools_from_its_header(llama3_model_dir: Path) -> None:
    family, served = _family(llama3_model_dir)
    assert family.facts(_prompt(served, [{"role": "user", "content": "hi"}])).thinking is None
    plain = served.template.render([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert family.facts(served.tokenizer.encode(plain, add_special_tokens=False)).tools == ()


def test_tools_block_is_read_per_family_markup() -> None:
    hermes = '<tools>\n{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}\n</tools>'
    assert [t.name for t in tools_in_text(hermes, "hermes")] == ["f"]
    deepseek = (
        '## Tools\n\nYou can call\n\n### f\nDescription: d\n\nParameters: {"type": "object"}\n\nTo call functions'
    )
    assert [t.name for t in tools_in_text(deepseek, "deepseek_v3")] == ["f"]
    assert tools_in_text("no tools here {", "hermes") == ()


def test_the_wire_constraint_is_read_and_checked_as_an_engine_would() -> None:
    choice = pb.SamplingParams(choice=pb.ChoiceConstraint(choices=["a", "b"]))
    assert sampling_spec(choice).constraint == Constraint("choice", choices=("a", "b"))
    assert sampling_spec(pb.SamplingParams(regex="[0-9]+")).constraint == Constraint("regex", "[0-9]+")
    assert sampling_spec(pb.SamplingParams(json_object=True)).constraint == Constraint("json_object")
    assert sampling_spec(pb.SamplingParams()).constraint is None
    for bad in (pb.SamplingParams(json_schema='{"type": "strin"}'), pb.SamplingParams(regex="(a)\\1")):
        with pytest.raises(InvalidRequestError):
            sampling_spec(bad)


def test_a_script_is_written_then_ended_and_max_tokens_cuts_a_prefix() -> None:
    vocabulary = TextVocabulary(words=tuple(range(100, 110)), function_words=(), capitalized=(), comma=1, period=2)
    script = ((7, 8), Prose(3), (9,))

    def stream(max_tokens: int) -> tuple[list[int], str | None]:
        s = TokenStream(
            vocabulary=vocabulary,
            eos=EosPolicy(900, (900,)),
            sampling=SamplingSpec(),
            prompt_ids=(1, 2),
            index=0,
            engine_seed=0,
            eos_after_tokens=20,
            max_tokens=max_tokens,
            script=script,
        )
        tokens, finish = s.take(100)
        return tokens, finish.reason if finish else None

    whole, reason = stream(100)
    assert reason == "stop" and whole[:2] == [7, 8] and whole[-2:] == [9, 900] and len(whole) == 7
    assert stream(4) == (whole[:4], "length")


def test_a_reasoning_block_the_gateway_closed_is_answered(qwen_model_dir: Path) -> None:
    """The continue step's prompt (node/pipeline/continuation.py): the model's reasoning cut at the budget,
    then the family's close. The engine answers from there, without reasoning again."""
    family, served = _family(qwen_model_dir)
    close = served.parsers.think_close_ids
    reasoning = served.tokenizer.encode("<think>\nLet me think about the weather in", add_special_tokens=False)
    prompt = _prompt(served, [{"role": "user", "content": "Weather in Paris?"}])
    if family.facts(prompt).thinking == "open":  # the template opened the block: the model did not write it
        reasoning = reasoning[1:]
    continued = [*prompt, *reasoning, *close]
    assert family.facts(continued).thinking == "off"
    for seed in range(10):
        script = family.script(continued, None, seed, mean_length=5)
        text = _text(family, served, script) if script is not None else ""
        assert "<think>" not in text and "</think>" not in text
