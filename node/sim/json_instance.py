"""Random instances of a JSON schema, for the simulated engine's answer under a json_schema constraint.

Pure: randomness from the caller's ``random.Random``. Covered, exactly: ``type`` (one name or a list),
``enum``, ``const``, ``anyOf`` / ``oneOf`` (one branch), ``allOf`` (object branches merged), local ``$ref``
(``#/$defs/...``, ``#/definitions/...``), objects (every ``required`` property, about half of the optional
ones), arrays (``items``, ``prefixItems``, ``minItems``/``maxItems``), strings (``minLength``/``maxLength``,
``pattern`` via ``node.sim.regex_sample``, a few ``format`` values), numbers and integers (``minimum``,
``maximum``, exclusive bounds, integer ``multipleOf``), booleans and null. Not covered: ``not``,
``if``/``then``, ``patternProperties``, ``dependentRequired``, a pattern together with length bounds it
contradicts (the pattern wins). ``words`` supplies readable string content.
"""

from __future__ import annotations

import math
import random
import string
from collections.abc import Mapping, Sequence
from typing import Any

from node.sim.regex_sample import sample_regex

# Nesting past which optional content is dropped (no optional properties, minimum array lengths), so a
# recursive schema ($ref to itself) ends.
MAX_DEPTH = 8
# Array items when the schema bounds neither side.
DEFAULT_MAX_ITEMS = 3
# Bounds of a number the schema leaves open.
DEFAULT_NUMBER_RANGE = (-100, 1000)
_FORMATS: Mapping[str, str] = {
    "date": "2026-11-25",
    "date-time": "2026-11-25T12:00:00Z",
    "time": "12:00:00",
    "email": "user@example.com",
    "uri": "https://example.com/",
    "uuid": "123e4567-e89b-12d3-a456-426614174000",
    "ipv4": "192.0.2.1",
}
_FALLBACK_WORDS = ("alpha", "bravo", "delta", "echo", "harbor", "lima", "river", "stone")


def sample_schema(schema: object, rng: random.Random, words: Sequence[str] = ()) -> Any:
    """A JSON value the schema accepts (a ``True`` or empty schema: a small object)."""
    return _Sampler(schema, rng, words or _FALLBACK_WORDS).value(schema, 0)


class _Sampler:
    def __init__(self, root: object, rng: random.Random, words: Sequence[str]) -> None:
        self._root = root
        self._rng = rng
        self._words = words

    def value(self, schema: object, depth: int) -> Any:
        if not isinstance(schema, dict):
            return {} if schema is not False else None
        rng = self._rng
        ref = schema.get("$ref")
        if isinstance(ref, str):
            return self.value(self._resolve(ref), depth + 1)
        if "const" in schema:
            return schema["const"]
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            return rng.choice(schema["enum"])
        for key in ("anyOf", "oneOf"):
            branches = schema.get(key)
            if isinstance(branches, list) and branches:
                rest = {k: v for k, v in schema.items() if k != key}
                branch = rng.choice(branches)
                return self.value({**rest, **branch} if isinstance(branch, dict) else branch, depth)
        if isinstance(schema.get("allOf"), list):
            merged = {k: v for k, v in schema.items() if k != "allOf"}
            for part in schema["allOf"]:
                if isinstance(part, dict):
                    merged = _merge(merged, part)
            return self.value(merged, depth)
        kind = schema.get("type")
        if isinstance(kind, list):
            kind = rng.choice(kind) if kind else None
        if kind is None:
            kind = _infer_type(schema)
        if kind == "object":
            return self._object(schema, depth)
        if kind == "array":
            return self._array(schema, depth)
        if kind == "string":
            return self._string(schema)
        if kind == "integer":
            return self._integer(schema)
        if kind == "number":
            return self._number(schema)
        if kind == "boolean":
            return rng.random() < 0.5
        return None

    def _resolve(self, ref: str) -> object:
        node: object = self._root
        if not ref.startswith("#"):
            return {}
        for part in ref.lstrip("#").strip("/").split("/") if ref != "#" else []:
            node = node.get(part.replace("~1", "/").replace("~0", "~"), {}) if isinstance(node, dict) else {}
        return node

    def _object(self, schema: Mapping[str, Any], depth: int) -> dict[str, Any]:
        props = schema.get("properties")
        props = props if isinstance(props, dict) else {}
        required = [r for r in schema.get("required", ()) if isinstance(r, str)]
        out: dict[str, Any] = {}
        for name, child in props.items():
            if name in required or (depth < MAX_DEPTH and self._rng.random() < 0.5):
                out[name] = self.value(child, depth + 1)
        for name in required:
            if name not in out:
                out[name] = self.value(schema.get("additionalProperties", {"type": "string"}), depth + 1)
        return out

    def _array(self, schema: Mapping[str, Any], depth: int) -> list[Any]:
        low = int(schema.get("minItems", 0))
        high = schema.get("maxItems")
        high = int(high) if isinstance(high, int) else max(low, DEFAULT_MAX_ITEMS)
        prefix = schema.get("prefixItems")
        prefix = prefix if isinstance(prefix, list) else []
        count = low if depth >= MAX_DEPTH else self._rng.randint(low, max(low, min(high, low + DEFAULT_MAX_ITEMS)))
        count = max(count, min(len(prefix), high)) if prefix else count
        items = schema.get("items", {})
        return [self.value(prefix[i] if i < len(prefix) else items, depth + 1) for i in range(count)]

    def _string(self, schema: Mapping[str, Any]) -> str:
        pattern = schema.get("pattern")
        if isinstance(pattern, str):
            return sample_regex(pattern, self._rng)
        fmt = schema.get("format")
        low = int(schema.get("minLength", 0))
        high_raw = schema.get("maxLength")
        high = int(high_raw) if isinstance(high_raw, int) else None
        if isinstance(fmt, str) and fmt in _FORMATS:
            text = _FORMATS[fmt]
            if len(text) >= low and (high is None or len(text) <= high):
                return text
        text = self._word()
        while len(text) < low:
            text += " " + self._word()
        if len(text) < low:
            text += "x" * (low - len(text))
        if high is not None and len(text) > high:
            text = text[:high] if high >= low else text[:low]
        return text

    def _integer(self, schema: Mapping[str, Any]) -> int:
        low, high = _bounds(schema)
        lo, hi = math.ceil(low), math.floor(high)
        ex_lo, ex_hi = _number_or_none(schema, "exclusiveMinimum"), _number_or_none(schema, "exclusiveMaximum")
        if ex_lo is not None:
            lo = max(lo, math.floor(ex_lo) + 1)
        if ex_hi is not None:
            hi = min(hi, math.ceil(ex_hi) - 1)
        hi = max(lo, hi)
        step = schema.get("multipleOf")
        if isinstance(step, int) and not isinstance(step, bool) and step > 0:
            first = -(-lo // step) * step
            if first <= hi:
                return first + step * self._rng.randint(0, (hi - first) // step)
        return self._rng.randint(lo, hi)

    def _number(self, schema: Mapping[str, Any]) -> float:
        low, high = _bounds(schema)
        ex_lo, ex_hi = _number_or_none(schema, "exclusiveMinimum"), _number_or_none(schema, "exclusiveMaximum")
        value = round(self._rng.uniform(low, high), 2)
        if not low <= value <= high or (ex_lo is not None and value <= ex_lo) or (ex_hi is not None and value >= ex_hi):
            value = (low + high) / 2
        return value

    def _word(self) -> str:
        return self._rng.choice(self._words).strip() or self._rng.choice(string.ascii_lowercase)


def _number_or_none(schema: Mapping[str, Any], key: str) -> float | None:
    value = schema.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _bounds(schema: Mapping[str, Any]) -> tuple[float, float]:
    low_raw, high_raw = schema.get("minimum"), schema.get("maximum")
    low = float(low_raw) if isinstance(low_raw, int | float) else None
    high = float(high_raw) if isinstance(high_raw, int | float) else None
    for key, is_low in (("exclusiveMinimum", True), ("exclusiveMaximum", False)):
        value = schema.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            if is_low and low is None:
                low = float(value)
            if not is_low and high is None:
                high = float(value)
    if low is None and high is None:
        return float(DEFAULT_NUMBER_RANGE[0]), float(DEFAULT_NUMBER_RANGE[1])
    if low is None:
        low = min(float(DEFAULT_NUMBER_RANGE[0]), high - 100 if high is not None else 0.0)
    if high is None:
        high = max(float(DEFAULT_NUMBER_RANGE[1]), low + 100)
    return low, high


def _infer_type(schema: Mapping[str, Any]) -> str:
    if "properties" in schema or "required" in schema or "additionalProperties" in schema:
        return "object"
    if "items" in schema or "prefixItems" in schema or "minItems" in schema:
        return "array"
    if "pattern" in schema or "minLength" in schema or "maxLength" in schema or "format" in schema:
        return "string"
    if "minimum" in schema or "maximum" in schema or "multipleOf" in schema:
        return "number"
    return "object"


def _merge(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for key, value in b.items():
        if key == "properties" and isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        elif key == "required" and isinstance(value, list) and isinstance(out.get(key), list):
            out[key] = [*out[key], *value]
        else:
            out[key] = value
    return out
