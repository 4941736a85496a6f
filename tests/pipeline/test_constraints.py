"""Every way a request asks for structured output becomes one engine constraint; what no engine can apply is a
400 naming the field, never silently dropped."""

from __future__ import annotations

import json
from typing import Any

import pytest

from node.errors import InvalidRequest
from node.pipeline.constraints import (
    OutputConstraint,
    ToolForcing,
    calls_from_output,
    resolve,
)
from node.structured.constraint import Constraint

SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}},
    {"type": "function", "function": {"name": "ping"}},
]


def _one(**kw: Any) -> OutputConstraint:
    found = resolve(**kw)
    assert found is not None
    return found


def test_each_source_maps_to_its_proto_kind() -> None:
    assert resolve() is None
    assert resolve(response_format={"type": "text"}, text_format={"format": {"type": "text"}}) is None
    assert _one(response_format={"type": "json_object"}).constraint == Constraint("json_object")
    fmt = {"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA, "strict": True}}
    schema = _one(response_format=fmt).constraint
    assert schema.kind == "json_schema" and json.loads(schema.text) == SCHEMA
    responses = {"format": {"type": "json_schema", "name": "c", "schema": SCHEMA, "strict": True}}
    assert _one(text_format=responses).constraint == schema
    assert _one(structured_outputs={"regex": "[0-9]{3}"}).constraint == Constraint("regex", "[0-9]{3}")
    assert _one(structured_outputs={"choice": ["a", "b"]}).constraint == Constraint("choice", choices=("a", "b"))
    grammar = 'root ::= "yes" | "no"'
    assert _one(structured_outputs={"grammar": grammar}).constraint == Constraint("grammar", grammar)
    assert _one(structured_outputs={"json": json.dumps(SCHEMA)}).constraint == schema
    tag = _one(structured_outputs={"structural_tag": {"type": "structural_tag", "structures": []}}).constraint
    assert tag.kind == "structural_tag" and json.loads(tag.text)["type"] == "structural_tag"
    # vLLM < 0.12 spellings, still sent by clients.
    assert _one(legacy={"guided_regex": "a+"}).constraint == Constraint("regex", "a+")
    assert _one(legacy={"guided_choice": ["x"]}).constraint.choices == ("x",)
    assert _one(legacy={"guided_json": SCHEMA}).constraint == schema
    # Options-only structured_outputs constrain nothing.
    assert resolve(structured_outputs={"disable_any_whitespace": True}) is None


def test_tool_choice_forces_calls_through_a_schema() -> None:
    assert resolve(tools=TOOLS, tool_choice="auto") is None
    assert resolve(tools=TOOLS, tool_choice="none") is None
    named = _one(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert named.forcing == ToolForcing("get_weather")
    assert json.loads(named.constraint.text) == SCHEMA, "a named call: exactly that function's arguments"
    flat = [{"type": "function", "name": "ping", "parameters": None}]
    assert _one(tools=flat, tool_choice={"type": "function", "name": "ping"}).forcing == ToolForcing("ping")
    required = _one(tools=TOOLS, tool_choice="required")
    assert required.forcing == ToolForcing(None)
    array = json.loads(required.constraint.text)
    assert array["type"] == "array" and array["minItems"] == 1
    names = [branch["properties"]["name"]["enum"] for branch in array["items"]["anyOf"]]
    assert names == [["get_weather"], ["ping"]]


def test_constrained_output_reads_back_as_calls() -> None:
    assert calls_from_output('{"city": "Oslo"}', ToolForcing("get_weather")) == [("get_weather", '{"city":"Oslo"}')]
    out = '[{"name": "ping", "parameters": {}}, {"name": "get_weather", "parameters": {"city": "Lima"}}]'
    assert calls_from_output(out, ToolForcing(None)) == [("ping", "{}"), ("get_weather", '{"city":"Lima"}')]
    assert calls_from_output('{"city": "Os', ToolForcing("get_weather")) is None, "cut by max_tokens: no call"
    assert calls_from_output("[]", ToolForcing(None)) is None


@pytest.mark.parametrize(
    ("kw", "param"),
    [
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"response_format": "json"}, "response_format"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format.json_schema.schema",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "strin"}}}},
            "response_format.json_schema.schema.type",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"properties": {"a": 3}}}}},
            "response_format.json_schema.schema.properties.a",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"maxLength": 2, "minLength": 5}}}},
            "response_format.json_schema.schema.minLength",
        ),
        ({"text_format": {"format": {"type": "json_schema", "schema": []}}}, "text.format.schema"),
        ({"structured_outputs": {"regex": "(a)\\1"}}, "structured_outputs.regex"),
        ({"structured_outputs": {"regex": "a(?=b)"}}, "structured_outputs.regex"),
        ({"structured_outputs": {"regex": "("}}, "structured_outputs.regex"),
        ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
        ({"structured_outputs": {"grammar": "  "}}, "structured_outputs.grammar"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
        ({"structured_outputs": {"json": "{not json"}}, "structured_outputs.json"),
        ({"legacy": {"guided_json": {"pattern": "(?<=x)y"}}}, "guided_json.pattern"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        ({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}}, "structured_outputs"),
        ({"tools": TOOLS, "tool_choice": "required", "legacy": {"guided_regex": "a"}}, "tool_choice"),
    ],
)
def test_what_no_engine_can_apply_is_refused_naming_the_field(kw: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        resolve(**kw)
    assert caught.value.param == param, caught.value.message


def test_a_hostile_schema_is_bounded() -> None:
    deep: dict[str, Any] = {"type": "object"}
    for _ in range(100):
        deep = {"type": "object", "properties": {"x": deep}}
    with pytest.raises(InvalidRequest, match="nests deeper"):
        resolve(response_format={"type": "json_schema", "json_schema": {"schema": deep}})
    with pytest.raises(InvalidRequest, match="more than"):
        resolve(structured_outputs={"choice": ["a"] * 5000})
