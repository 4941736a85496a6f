"""The fast chat-template engine (minijinja) renders exactly what the reference (jinja2's immutable sandbox)
renders, or leaves the request to the reference."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from node.pipeline.template import ChatTemplate, TemplateError

SHIPPED = Path(__file__).resolve().parents[2] / "node" / "models" / "templates"
FIXED_NOW = datetime(2026, 11, 29, 8, 0, 0)


def pair(source: str) -> tuple[ChatTemplate, ChatTemplate]:
    """The template with the fast engine where it qualifies, and the reference alone."""
    kw: dict[str, Any] = {"bos_token": "<s>", "eos_token": "</s>", "now": lambda: FIXED_NOW}
    return ChatTemplate(source, **kw), ChatTemplate(source, fast=False, **kw)


def outcome(template: ChatTemplate, *args: Any, **kwargs: Any) -> tuple[str, str]:
    try:
        return "text", template.render(*args, **kwargs)
    except TemplateError as exc:
        return "error", exc.message


SHIPPED_PAIRS = {path.stem: pair(path.read_text(encoding="utf-8")) for path in sorted(SHIPPED.glob("*.jinja"))}


def test_the_shipped_templates_render_with_minijinja() -> None:
    assert set(SHIPPED_PAIRS) == {"deepseek", "llama3", "qwen"}
    for fast, reference in SHIPPED_PAIRS.values():
        assert fast.engine == "minijinja"
        assert reference.engine == "jinja2"


# Text that stresses both engines: markup, template syntax, special-token look-alikes, whitespace, non-ASCII.
TEXT = st.lists(
    st.sampled_from(
        [*"ab Z09\n\t{}%#<>/&'\"\\", "{{", "}}", "{%", "<think>", "</think>", "<|im_end|>", "é", "日本", "😀", "\u0301"]
    ),
    max_size=30,
).map("".join)
ARGUMENTS = st.one_of(
    TEXT,
    st.dictionaries(
        st.sampled_from(["city", "n", "flag", "opt", "nested"]),
        st.one_of(TEXT, st.integers(-(2**40), 2**40), st.booleans(), st.none(), st.lists(TEXT, max_size=2)),
        max_size=3,
    ),
)
TOOL_CALL = st.fixed_dictionaries(
    {
        "id": st.sampled_from(["call_1", "call_2"]),
        "type": st.just("function"),
        "function": st.fixed_dictionaries(
            {"name": st.sampled_from(["get_weather", "get_time"]), "arguments": ARGUMENTS}
        ),
    }
)


@st.composite
def message(draw: st.DrawFn) -> dict[str, Any]:
    role = draw(st.sampled_from(["system", "developer", "user", "assistant", "tool"]))
    item: dict[str, Any] = {"role": role, "content": draw(TEXT)}
    if role == "assistant":
        if draw(st.booleans()):
            item["tool_calls"] = draw(st.lists(TOOL_CALL, min_size=1, max_size=2))
            if draw(st.booleans()):
                item["content"] = None
        if draw(st.booleans()):
            item["reasoning_content"] = draw(TEXT)
    if role == "tool":
        item["tool_call_id"] = "call_1"
        if draw(st.booleans()):
            item["name"] = "get_weather"
    if role == "user" and draw(st.booleans()):
        item["content"] = [{"type": "text", "text": draw(TEXT)} for _ in range(draw(st.integers(1, 2)))]
    return item


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather <now> & 'then'",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
                "required": ["city"],
            },
        },
    },
    {"type": "function", "function": {"name": "get_time", "description": "", "parameters": {}}},
]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(sorted(SHIPPED_PAIRS)),
    messages=st.lists(message(), min_size=1, max_size=6),
    tools=st.one_of(st.none(), st.just(TOOLS[:1]), st.just(TOOLS)),
    add_generation_prompt=st.booleans(),
    extra=st.one_of(st.none(), st.fixed_dictionaries({"enable_thinking": st.booleans()})),
)
def test_the_fast_engine_renders_what_the_reference_renders(
    name: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    add_generation_prompt: bool,
    extra: dict[str, Any] | None,
) -> None:
    fast, reference = SHIPPED_PAIRS[name]
    args = (messages,)
    kwargs: dict[str, Any] = {"tools": tools, "add_generation_prompt": add_generation_prompt, "extra": extra}
    assert outcome(fast, *args, **kwargs) == outcome(reference, *args, **kwargs)


def test_a_template_that_mutates_its_input_renders_with_the_reference() -> None:
    # minijinja-py would call list.append on the request's own list; jinja2's immutable sandbox refuses.
    fast, _ = pair("{% set _ = messages.append({'role': 'x'}) %}{{ messages | length }}")
    assert fast.engine == "jinja2"
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(TemplateError):
        fast.render(messages)
    assert messages == [{"role": "user", "content": "hi"}]


def test_the_fast_engine_renders_from_a_copy() -> None:
    # Even a template that passes every probe cannot reach the request's objects through the fast engine.
    source = (
        "{% if messages[0].content == 'mutate' %}{% set _ = messages[0].update({'content': 'changed'}) %}"
        "{% set _ = tools[0].clear() %}{% endif %}{{ messages[0].content }}"
    )
    fast, _ = pair(source)
    assert fast.engine == "minijinja"
    messages = [{"role": "user", "content": "mutate"}]
    tools = [{"type": "function", "function": {"name": "f"}}]
    fast.render(messages, tools=tools)  # the reference would refuse; what matters here is the caller's data
    assert messages == [{"role": "user", "content": "mutate"}]
    assert tools == [{"type": "function", "function": {"name": "f"}}]


@pytest.mark.parametrize(("value", "printed"), [(1e20, "1e+20"), (1e-7, "1e-07"), (10**30, str(10**30)), (2.5, "2.5")])
def test_values_minijinja_prints_differently_render_with_the_reference(value: Any, printed: str) -> None:
    fast, _ = pair("{% for t in tools or [] %}{{ t.function.parameters.default }}{% endfor %}")
    assert fast.engine == "minijinja"
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"default": value}}}]
    assert fast.render([{"role": "user", "content": "x"}], tools=tools) == printed


def test_a_template_minijinja_renders_differently_renders_with_the_reference() -> None:
    fast, _ = pair("{{ 1e20 }} {{ messages[0].content }}")  # minijinja: 100000000000000000000.0
    assert fast.engine == "jinja2"
    assert fast.render([{"role": "user", "content": "hi"}]) == "1e+20 hi"


@pytest.mark.parametrize(
    ("source", "rendered"),
    [
        ("{{ messages[0].content|center(6) }}", "  hi  "),  # no `center` filter in minijinja
        ("{{ '%s!' % messages[0].content }}", "hi!"),  # no printf-style `%` on strings
    ],
)
def test_a_template_minijinja_cannot_render_renders_with_the_reference(source: str, rendered: str) -> None:
    fast, _ = pair(source)
    assert fast.engine == "jinja2"
    assert fast.render([{"role": "user", "content": "hi"}]) == rendered


def test_errors_are_the_references() -> None:
    source = (
        "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('No tool turns, please.') }}"
        "{% endif %}{{ m.content }}{% endfor %}"
    )
    fast, reference = pair(source)
    assert fast.engine == "minijinja"  # both engines fail on the probes that hold a tool turn
    messages = [{"role": "user", "content": "hi"}, {"role": "tool", "content": "x", "tool_call_id": "1"}]
    assert outcome(fast, messages) == ("error", "No tool turns, please.") == outcome(reference, messages)
    assert outcome(fast, [{"role": "user", "content": "hi"}]) == ("text", "hi")
