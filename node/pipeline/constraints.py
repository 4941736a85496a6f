"""Structured-output constraints: what a request asks the engine to enforce, as smg-grpc-proto carries it.

Pure: parsed request fields in, one ``Constraint`` (the ``SamplingParams.constraint`` oneof of
vllm_engine.proto) and, for a forced tool call, a ``ToolForcing`` out. Sources, at most one per request:

- OpenAI ``response_format`` (chat, completions): ``text``, ``json_object``, ``json_schema`` (strict or not:
  the engine enforces the schema either way), and vLLM's ``structural_tag``;
- the Responses API's ``text.format`` (the same types, the schema fields flattened);
- vLLM's ``structured_outputs`` object (``json``, ``regex``, ``choice``, ``grammar``, ``json_object``,
  ``structural_tag``) and its pre-0.12 spellings ``guided_json/regex/choice/grammar``, which clients still send;
- ``tool_choice`` ``required`` or a named function, as vLLM does it: a named function constrains the output to
  that function's arguments (its ``parameters`` schema); ``required`` to a JSON array of one or more
  ``{"name", "parameters"}`` objects over the offered tools. ``calls_from_output`` reads such an output back
  as calls, for the API adapters to render as ``tool_calls`` / ``function_call`` items.

A constraint no engine could apply (unknown type, a schema that is not one, a regex with backreferences or
lookaround, an empty choice list, two sources at once) raises ``InvalidRequest`` naming the field: a 400 in
the API's envelope, never silently dropped. A grammar's syntax is the engine's to judge (xgrammar EBNF or
llguidance Lark); a worker that refuses one answers INVALID_ARGUMENT, which reaches the client as a 400 too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from node.errors import InvalidRequest
from node.structured.constraint import (
    MAX_CHOICES,
    Constraint,
    ConstraintError,
    ConstraintKind,
    ToolSpec,
    tool_specs,
)
from node.structured.constraint import (
    check_regex as _check_regex,
)
from node.structured.constraint import (
    check_schema as _check_schema,
)

# vLLM's structured_outputs keys, in the order of precedence it documents, mapped to our kinds.
_STRUCTURED_KEYS: Mapping[str, ConstraintKind] = {
    "json": "json_schema",
    "regex": "regex",
    "choice": "choice",
    "grammar": "grammar",
    "json_object": "json_object",
    "structural_tag": "structural_tag",
}
# Pre-0.12 vLLM request fields (removed from vLLM, still sent by clients) and the key they alias.
LEGACY_FIELDS: Mapping[str, str] = {
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
}


@dataclass(frozen=True, slots=True)
class ToolForcing:
    """tool_choice forced a call: ``name`` is the named function (the output is its arguments), None for
    ``required`` (the output is a JSON array of ``{"name", "parameters"}`` objects)."""

    name: str | None


@dataclass(frozen=True, slots=True)
class OutputConstraint:
    constraint: Constraint
    forcing: ToolForcing | None = None


def _compact(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def check_schema(schema: object, param: str) -> None:
    """``node.structured.constraint.check_schema``, as an InvalidRequest (400) naming the field."""
    try:
        _check_schema(schema, param)
    except ConstraintError as exc:
        raise InvalidRequest(exc.message, param=exc.param) from exc


def check_regex(pattern: object, param: str) -> str:
    """``node.structured.constraint.check_regex``, as an InvalidRequest (400) naming the field."""
    try:
        return _check_regex(pattern, param)
    except ConstraintError as exc:
        raise InvalidRequest(exc.message, param=exc.param) from exc


def _schema_constraint(schema: object, param: str) -> Constraint:
    check_schema(schema, param)
    return Constraint("json_schema", _compact(schema))


def _structural_tag(value: object, param: str) -> Constraint:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise InvalidRequest(f"'{param}' must be a JSON object: {exc}", param=param) from exc
    if not isinstance(value, dict):
        raise InvalidRequest(f"'{param}' must be a JSON object.", param=param)
    return Constraint("structural_tag", _compact(value))


def _from_structured(key: str, value: object, param: str) -> Constraint:
    kind = _STRUCTURED_KEYS[key]
    if kind == "json_schema":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as exc:
                raise InvalidRequest(f"'{param}' is not valid JSON: {exc}", param=param) from exc
        return _schema_constraint(value, param)
    if kind == "regex":
        return Constraint("regex", check_regex(value, param))
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value):
            raise InvalidRequest(f"'{param}' must be a non-empty array of strings.", param=param)
        if len(value) > MAX_CHOICES:
            raise InvalidRequest(f"'{param}' holds more than {MAX_CHOICES} choices.", param=param)
        return Constraint("choice", choices=tuple(value))
    if kind == "grammar":
        if not isinstance(value, str) or not value.strip():
            raise InvalidRequest(f"'{param}' must be a non-empty grammar.", param=param)
        return Constraint("grammar", value)
    if kind == "json_object":
        if value is not True:
            raise InvalidRequest(f"'{param}' must be true when given.", param=param)
        return Constraint("json_object")
    return _structural_tag(value, param)


def from_structured_outputs(value: object, param: str = "structured_outputs") -> Constraint | None:
    """vLLM's ``structured_outputs`` object; None when it sets no constraint (only options such as
    ``disable_any_whitespace``, which the engine's own configuration decides here)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidRequest(f"'{param}' must be an object.", param=param)
    keys = [k for k in _STRUCTURED_KEYS if value.get(k) is not None and value.get(k) is not False]
    if len(keys) > 1:
        raise InvalidRequest(
            f"'{param}' may set only one of {', '.join(_STRUCTURED_KEYS)}; it sets {', '.join(keys)}.", param=param
        )
    return _from_structured(keys[0], value[keys[0]], f"{param}.{keys[0]}") if keys else None


def from_response_format(value: object, param: str = "response_format") -> Constraint | None:
    """OpenAI's ``response_format`` (chat, completions)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidRequest(f"'{param}' must be an object.", param=param)
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return Constraint("json_object")
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict):
            raise InvalidRequest(f"'{param}.json_schema' must be an object.", param=f"{param}.json_schema")
        return _json_schema_spec(spec, f"{param}.json_schema")
    if kind == "structural_tag":
        return _structural_tag(value, param)
    raise InvalidRequest(
        f"'{param}.type' must be 'text', 'json_object', 'json_schema' or 'structural_tag', got {kind!r}.",
        param=f"{param}.type",
    )


def _json_schema_spec(spec: Mapping[str, object], param: str) -> Constraint:
    name = spec.get("name")
    if name is not None and not isinstance(name, str):
        raise InvalidRequest(f"'{param}.name' must be a string.", param=f"{param}.name")
    if "schema" not in spec:
        raise InvalidRequest(f"'{param}.schema' is required.", param=f"{param}.schema")
    return _schema_constraint(spec["schema"], f"{param}.schema")


def from_text_format(text: object, param: str = "text") -> Constraint | None:
    """The Responses API's ``text`` (``{"format": {"type": ..., "schema": ...}}``)."""
    if text is None:
        return None
    if not isinstance(text, dict):
        raise InvalidRequest(f"'{param}' must be an object.", param=param)
    fmt = text.get("format")
    if fmt is None:
        return None
    where = f"{param}.format"
    if not isinstance(fmt, dict):
        raise InvalidRequest(f"'{where}' must be an object.", param=where)
    kind = fmt.get("type")
    if kind == "json_schema":
        return _json_schema_spec(fmt, where)
    if kind in ("text", "json_object"):
        return from_response_format({"type": kind}, where)
    raise InvalidRequest(
        f"'{where}.type' must be 'text', 'json_object' or 'json_schema', got {kind!r}.", param=f"{where}.type"
    )


def forced_tool(tool_choice: object, param: str = "tool_choice") -> ToolForcing | None:
    """What ``tool_choice`` forces: None for absent/"auto"/"none", else required or a named function
    (chat ``{"type": "function", "function": {"name"}}`` or Responses ``{"type": "function", "name"}``)."""
    if tool_choice is None or tool_choice in ("auto", "none"):
        return None
    if tool_choice == "required":
        return ToolForcing(None)
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        fn = tool_choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else tool_choice.get("name")
        if isinstance(name, str) and name:
            return ToolForcing(name)
        raise InvalidRequest(f"'{param}' must name the function to call.", param=param)
    raise InvalidRequest(
        f"'{param}' must be 'none', 'auto', 'required' or {{\"type\": \"function\", ...}} naming a function.",
        param=param,
    )


def tool_constraint(forcing: ToolForcing, tools: Sequence[ToolSpec], param: str = "tool_choice") -> Constraint:
    """The json_schema that makes the engine answer with the forced call(s), as vLLM builds it."""
    if not tools:
        raise InvalidRequest(f"'{param}' forces a tool call, but the request offers no tools.", param=param)
    for i, tool in enumerate(tools):
        check_schema(tool.parameters, f"tools[{i}].parameters")
    if forcing.name is not None:
        for tool in tools:
            if tool.name == forcing.name:
                return Constraint("json_schema", _compact(tool.parameters))
        raise InvalidRequest(f"'{param}' names the function {forcing.name!r}, which is not in 'tools'.", param=param)
    calls = [
        {
            "properties": {"name": {"type": "string", "enum": [t.name]}, "parameters": t.parameters},
            "required": ["name", "parameters"],
        }
        for t in tools
    ]
    schema = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": calls}}
    return Constraint("json_schema", _compact(schema))


def resolve(
    *,
    response_format: object = None,
    text_format: object = None,
    structured_outputs: object = None,
    legacy: Mapping[str, object] | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
    tool_choice: object = None,
) -> OutputConstraint | None:
    """The request's one constraint, from whichever field sets it; None when none does.

    Raises:
        InvalidRequest: a field is malformed or cannot be enforced, or two fields constrain the output.
    """
    if (
        response_format is None
        and text_format is None
        and structured_outputs is None
        and tool_choice is None
        and not (legacy and any(value is not None for value in legacy.values()))
    ):
        return None  # the usual request: nothing constrains its output
    found: list[tuple[str, OutputConstraint]] = []
    for param, constraint in (
        ("response_format", from_response_format(response_format)),
        ("text.format", from_text_format(text_format)),
        ("structured_outputs", from_structured_outputs(structured_outputs)),
    ):
        if constraint is not None:
            found.append((param, OutputConstraint(constraint)))
    for field, key in LEGACY_FIELDS.items():
        value = (legacy or {}).get(field)
        if value is not None:
            found.append((field, OutputConstraint(_from_structured(key, value, field))))
    forcing = forced_tool(tool_choice)
    if forcing is not None:
        found.append(("tool_choice", OutputConstraint(tool_constraint(forcing, tool_specs(tools)), forcing)))
    if len(found) > 1:
        names = ", ".join(f"'{p}'" for p, _ in found)
        raise InvalidRequest(f"Only one field may constrain the output; this request sets {names}.", param=found[1][0])
    return found[0][1] if found else None


def calls_from_output(text: str, forcing: ToolForcing) -> list[tuple[str, str]] | None:
    """The (name, arguments JSON) calls in an output constrained by ``forcing``; None when the output is not
    a complete call (cut by max_tokens, or an engine that did not enforce the constraint)."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if forcing.name is not None:
        return [(forcing.name, _compact(value))] if isinstance(value, dict) else None
    if not isinstance(value, list) or not value:
        return None
    calls: list[tuple[str, str]] = []
    for item in value:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            return None
        calls.append((item["name"], _compact(item.get("parameters", {}))))
    return calls
