"""The structured-output constraint of the engine contract, and the checks a constrained decoder would apply.

Pure. ``Constraint`` is one value of smg-grpc-proto's ``SamplingParams.constraint`` oneof; the checks raise
``ConstraintError`` naming the offending field, which the gateway turns into a 400 (node.pipeline.constraints)
and the simulated engine into INVALID_ARGUMENT (node.sim.wire), as vLLM answers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from node.structured.regex_ast import RegexUnsupported, parse_regex

ConstraintKind = Literal["json_schema", "regex", "grammar", "structural_tag", "json_object", "choice"]

# Nesting of a JSON schema we walk to check it: real schemas nest a few levels; this bounds the recursion a
# hostile schema could make us (and the engine's grammar compiler) do.
MAX_SCHEMA_DEPTH = 32
# Choices of a `choice` constraint: each becomes a branch of the engine's grammar.
MAX_CHOICES = 1024
# JSON schema "type" names (draft 2020-12).
SCHEMA_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})


class ConstraintError(ValueError):
    """A constraint no engine could apply; ``param`` names the field (dotted path) at fault."""

    def __init__(self, message: str, *, param: str) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


@dataclass(frozen=True, slots=True)
class Constraint:
    """One value of the proto's ``constraint`` oneof. ``text`` is compact JSON for json_schema and
    structural_tag, the pattern for regex, the grammar for grammar, empty for json_object and choice."""

    kind: ConstraintKind
    text: str = ""
    choices: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """An offered function: its name and arguments schema (``{"type": "object"}`` when it declares none)."""

    name: str
    parameters: Mapping[str, Any]


def check_schema(schema: object, param: str, depth: int = 0) -> None:
    """Raise ConstraintError (naming ``param``) unless ``schema`` is shaped like a JSON schema whose keywords an
    engine can compile: typed keywords of the right JSON type, known ``type`` names, compilable patterns."""
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise ConstraintError(f"'{param}' must be a JSON schema object.", param=param)
    if depth > MAX_SCHEMA_DEPTH:
        raise ConstraintError(f"'{param}' nests deeper than {MAX_SCHEMA_DEPTH} levels.", param=param)
    kind = schema.get("type")
    for name in [kind] if isinstance(kind, str) else kind if isinstance(kind, list) else []:
        if name not in SCHEMA_TYPES:
            raise ConstraintError(f"'{param}.type' names an unknown type {name!r}.", param=f"{param}.type")
    if kind is not None and not isinstance(kind, str | list):
        raise ConstraintError(f"'{param}.type' must be a string or a list of strings.", param=f"{param}.type")
    for key in ("enum", "required", "anyOf", "oneOf", "allOf", "prefixItems"):
        if key in schema and not isinstance(schema[key], list):
            raise ConstraintError(f"'{param}.{key}' must be an array.", param=f"{param}.{key}")
    if "enum" in schema and not schema["enum"]:
        raise ConstraintError(f"'{param}.enum' must not be empty.", param=f"{param}.enum")
    if any(not isinstance(r, str) for r in schema.get("required", ())):
        raise ConstraintError(f"'{param}.required' must list property names.", param=f"{param}.required")
    for key in ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties"):
        value = schema.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ConstraintError(f"'{param}.{key}' must be a non-negative integer.", param=f"{param}.{key}")
    for low, high in (("minLength", "maxLength"), ("minItems", "maxItems"), ("minimum", "maximum")):
        lo, hi = schema.get(low), schema.get(high)
        if isinstance(lo, int | float) and isinstance(hi, int | float) and lo > hi:
            raise ConstraintError(f"'{param}.{low}' exceeds '{param}.{high}'.", param=f"{param}.{low}")
    pattern = schema.get("pattern")
    if pattern is not None:
        check_regex(pattern, f"{param}.pattern")
    for key in ("properties", "$defs", "definitions", "patternProperties"):
        children = schema.get(key)
        if children is None:
            continue
        if not isinstance(children, dict):
            raise ConstraintError(f"'{param}.{key}' must be an object.", param=f"{param}.{key}")
        for name, child in children.items():
            check_schema(child, f"{param}.{key}.{name}", depth + 1)
    for key in ("items", "additionalProperties", "not", "contains"):
        if key in schema:
            check_schema(schema[key], f"{param}.{key}", depth + 1)
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        for i, child in enumerate(schema.get(key, ())):
            check_schema(child, f"{param}.{key}[{i}]", depth + 1)


def check_regex(pattern: object, param: str) -> str:
    """``pattern`` when it is a regex a constrained decoder can apply; else ConstraintError naming ``param``."""
    if not isinstance(pattern, str):
        raise ConstraintError(f"'{param}' must be a string.", param=param)
    try:
        parse_regex(pattern)
    except RegexUnsupported as exc:
        raise ConstraintError(f"'{param}' cannot be enforced: {exc}.", param=param) from exc
    return pattern


def tool_specs(tools: Sequence[Mapping[str, Any]] | None) -> list[ToolSpec]:
    """Function tools in either shape (chat: ``{"function": {...}}``, Responses: flat)."""
    specs: list[ToolSpec] = []
    for tool in tools or ():
        fn = tool.get("function")
        fn = fn if isinstance(fn, dict) else tool
        params = fn.get("parameters")
        name = fn.get("name")
        if isinstance(name, str):
            specs.append(ToolSpec(name, params if isinstance(params, dict) else {"type": "object", "properties": {}}))
    return specs
