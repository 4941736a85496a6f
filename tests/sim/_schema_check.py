"""A small JSON-schema validator for tests (the keywords our sampler and the real engine's tests use).

No dependency is worth it for this: the keywords checked are type, enum, const, properties, required,
additionalProperties false, items, minItems/maxItems, minLength/maxLength, pattern (full match, as
constrained decoders apply it), minimum/maximum and their exclusive forms, multipleOf, anyOf/oneOf, $ref.
"""

from __future__ import annotations

import re
from typing import Any

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
}


def errors(value: Any, schema: Any, root: Any = None, path: str = "$") -> list[str]:
    root = schema if root is None else root
    if schema is True or schema == {}:
        return []
    if not isinstance(schema, dict):
        return [f"{path}: bad schema"]
    if "$ref" in schema:
        target: Any = root
        for part in schema["$ref"].lstrip("#").strip("/").split("/"):
            target = target[part] if part else target
        return errors(value, target, root, path)
    out: list[str] = []
    kind = schema.get("type")
    if kind is not None:
        kinds = kind if isinstance(kind, list) else [kind]
        ok = any(
            isinstance(value, _TYPES[k]) and not (k in ("integer", "number") and isinstance(value, bool)) for k in kinds
        )
        if "integer" in kinds and isinstance(value, float) and value.is_integer():
            ok = True
        if not ok:
            return [f"{path}: {value!r} is not {kind}"]
    if "enum" in schema and value not in schema["enum"]:
        out.append(f"{path}: {value!r} not in enum")
    if "const" in schema and value != schema["const"]:
        out.append(f"{path}: {value!r} != const")
    for key in ("anyOf", "oneOf"):
        if key in schema:
            rest = {k: v for k, v in schema.items() if k != key}
            if not any(not errors(value, {**rest, **b}, root, path) for b in schema[key]):
                out.append(f"{path}: matches no branch of {key}")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        out += [f"{path}: missing {name}" for name in schema.get("required", ()) if name not in value]
        for name, child in value.items():
            if name in props:
                out += errors(child, props[name], root, f"{path}.{name}")
            elif schema.get("additionalProperties") is False:
                out.append(f"{path}: unexpected {name}")
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0) or len(value) > schema.get("maxItems", 1 << 60):
            out.append(f"{path}: {len(value)} items out of bounds")
        for i, item in enumerate(value):
            out += errors(item, schema.get("items", {}), root, f"{path}[{i}]")
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0) or len(value) > schema.get("maxLength", 1 << 60):
            out.append(f"{path}: length {len(value)} out of bounds")
        if "pattern" in schema and re.fullmatch(schema["pattern"], value) is None:
            out.append(f"{path}: {value!r} does not match {schema['pattern']}")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            out.append(f"{path}: below minimum")
        if "maximum" in schema and value > schema["maximum"]:
            out.append(f"{path}: above maximum")
        if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
            out.append(f"{path}: not above exclusiveMinimum")
        if "exclusiveMaximum" in schema and value >= schema["exclusiveMaximum"]:
            out.append(f"{path}: not below exclusiveMaximum")
        if "multipleOf" in schema and value % schema["multipleOf"]:
            out.append(f"{path}: not a multiple of {schema['multipleOf']}")
    return out
