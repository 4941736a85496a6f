"""A chat template's fast renderer: the same source compiled by minijinja (Rust), used only where it renders
exactly what the reference renderer (`node.pipeline.template`: jinja2's immutable sandbox, transformers'
semantics) would.

Why: our Qwen3 template renders a two-message chat in ~38 µs under jinja2's sandbox and in ~9 µs under
minijinja (bench/RESULTS.md), a few per cent of the node's whole CPU cost of a short request (SMG renders with
minijinja too).

Where the engines differ, the reference decides:

- Values. minijinja prints floats in its own notation (``1e20`` as ``100000000000000000000.0``) and holds
  integers in 128 bits, so a context holding a float, or an integer outside ±2**63, renders with the
  reference (`fast_context` says so). Strings are valid Unicode: request bodies are decoded by msgspec,
  which rejects lone surrogates (minijinja would replace them).
- Mutation. minijinja-py hands a template the Python objects themselves and calls their public methods
  (``messages.append(...)`` would change the request; jinja2's immutable sandbox refuses), so the fast
  engine renders from a copy (`fast_context` makes it: dicts, lists and scalars only).
- Errors. Any failure of the fast engine (``raise_exception``, an undefined attribute, a type error) is
  rendered again by the reference, whose output or error is the answer: error paths cost both engines.
- Templates. When a template is loaded, both engines render a set of probe conversations (`PROBES`: every
  role, tools, tool calls with parsed and unparsed arguments, content parts, reasoning, the generation
  prompt on and off, common template switches); on any difference, output or error, that template renders
  with the reference alone.

Not covered: a template path no probe reaches, on which jinja2 would fail with a Python type error that
minijinja tolerates (``[1] is divisibleby 2`` is False there); the fast engine then renders where transformers
would refuse. For the templates we ship, a property test holds the two engines equal over random
conversations (tests/pipeline/test_template_fast.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import minijinja

# Integers minijinja and Python print alike, and that stay integers through its i128 arithmetic.
_INT_MIN: Final = -(2**63)
_INT_MAX: Final = 2**63 - 1
_NAME: Final = "chat"


class _Unsupported(Exception):
    """A context value the fast engine may not render like the reference."""


def _copy(value: Any) -> Any:
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return value
    if kind is int:
        if _INT_MIN <= value <= _INT_MAX:
            return value
        raise _Unsupported
    if kind is dict:
        out = {}
        for key, item in value.items():
            if type(key) is not str:
                raise _Unsupported
            out[key] = _copy(item)
        return out
    if kind is list:
        return [_copy(item) for item in value]
    # Floats, tuples (printed as "(...)" by jinja2), dict or list subclasses, any other object.
    raise _Unsupported


def fast_context(variables: Mapping[str, Any]) -> dict[str, Any] | None:
    """A copy of ``variables`` the fast engine renders exactly as the reference, or None when it holds a
    value that only the reference renders faithfully (see the module docstring)."""
    try:
        return {key: _copy(value) for key, value in variables.items()}
    except _Unsupported:
        return None
    except RecursionError:  # nesting deeper than the request limits allow reaches only the reference
        return None


class FastTemplate:
    """One template compiled by minijinja with the reference's options and globals. ``render`` raises
    whatever the engine raises; callers fall back to the reference on any exception."""

    __slots__ = ("_env",)

    def __init__(
        self,
        source: str,
        *,
        tojson: Callable[..., str],
        raise_exception: Callable[[str], None],
        strftime_now: Callable[[str], str],
    ) -> None:
        """Compile ``source``. Raises minijinja.TemplateError when minijinja cannot parse it."""
        env = minijinja.Environment(
            trim_blocks=True,
            lstrip_blocks=True,
            keep_trailing_newline=False,
            undefined_behavior="lenient",
            filters={"tojson": tojson},
            globals={"raise_exception": raise_exception, "strftime_now": strftime_now},
        )
        env.add_template(_NAME, source)
        self._env = env

    def render(self, context: Mapping[str, Any]) -> str:
        return self._env.render_template(_NAME, **context)


def _tool(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


_TOOLS: Final = [
    _tool(
        "get_weather",
        "Current weather in a city.",
        {"city": {"type": "string", "description": "City name"}, "unit": {"type": "string", "enum": ["c", "f"]}},
        ["city"],
    ),
    _tool("get_time", "The time now.", {}, []),
]
_CALL: Final = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": {"city": "Zürich"}},
}
_RAW_CALL: Final = {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}
_SYSTEM: Final = {"role": "system", "content": "You are a helpful assistant.\nAnswer briefly."}
_USER: Final = {"role": "user", "content": "Hello! What's 2 + 2? <b>&'\"</b> 日本語 😀"}
_ANSWER: Final = {"role": "assistant", "content": "It is 4."}

# (messages, tools, add_generation_prompt, extra): the shapes the HTTP APIs hand templates.
PROBES: Final[Sequence[tuple[list[dict[str, Any]], list[dict[str, Any]] | None, bool, dict[str, Any]]]] = (
    ([_USER], None, True, {}),
    ([_USER], None, False, {}),
    ([_SYSTEM, _USER], None, True, {}),
    ([{"role": "developer", "content": "Be terse."}, _USER], None, True, {}),
    ([_SYSTEM, _USER, _ANSWER, {"role": "user", "content": "And 3 + 3?"}], None, True, {}),
    ([_USER, {"role": "assistant", "content": "<think>\nadd\n</think>\n\nIt is 4."}, _USER], None, True, {}),
    ([_USER, {"role": "assistant", "content": "It is 4.", "reasoning_content": "add"}, _USER], None, True, {}),
    ([{"role": "user", "content": ""}], None, True, {}),
    (
        [{"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]}],
        None,
        True,
        {},
    ),
    ([_USER, {"role": "assistant", "content": None, "tool_calls": [_CALL]}], None, False, {}),
    ([_SYSTEM, _USER], _TOOLS, True, {}),
    ([_USER], _TOOLS, True, {}),
    (
        [
            _SYSTEM,
            _USER,
            {"role": "assistant", "content": None, "tool_calls": [_CALL, _RAW_CALL]},
            {"role": "tool", "content": '{"temp": 21}', "tool_call_id": "call_1", "name": "get_weather"},
            {"role": "tool", "content": "12:00", "tool_call_id": "call_2"},
        ],
        _TOOLS,
        True,
        {},
    ),
    (
        [
            _USER,
            {"role": "assistant", "content": "Checking.", "tool_calls": [_CALL]},
            {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
        ],
        _TOOLS,
        True,
        {},
    ),
    ([_SYSTEM, _USER], None, True, {"enable_thinking": False}),
    ([_SYSTEM, _USER], None, True, {"enable_thinking": True}),
    ([_USER], None, True, {"add_vision_id": False, "tools_in_user_message": False}),
)
