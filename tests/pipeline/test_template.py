from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from node.pipeline.model import load_model_folder
from node.pipeline.template import ChatTemplate, TemplateError
from node.pipeline.tokenizer import Tokenizer

SYSTEM_USER = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Hello!"},
]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def folder_template(folder: Path) -> ChatTemplate:
    model = load_model_folder(folder)
    assert model.chat_template is not None
    return ChatTemplate(model.chat_template, bos_token=model.bos_token, eos_token=model.eos_token)


@pytest.fixture(scope="module")
def llama3(llama3_model_dir: Path) -> ChatTemplate:
    return folder_template(llama3_model_dir)


@pytest.fixture(scope="module")
def deepseek(deepseek_model_dir: Path) -> ChatTemplate:
    return folder_template(deepseek_model_dir)


def plain(source: str) -> ChatTemplate:
    return ChatTemplate(source, bos_token="<s>", eos_token="</s>")


# --- Llama-3 ---


def test_llama3_matches_published_format(llama3: ChatTemplate) -> None:
    assert llama3.render(SYSTEM_USER) == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
        "You are a helpful assistant.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_llama3_multi_turn_trims_and_closes_turns(llama3: ChatTemplate) -> None:
    messages = [
        {"role": "developer", "content": " Be brief. "},
        {"role": "user", "content": "Hi\n"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Bye"},
    ]
    assert llama3.render(messages, add_generation_prompt=False) == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
    )


@pytest.mark.parametrize(("family", "bos_id"), [("llama3", 128000), ("deepseek", 0)])
def test_rendered_prompt_has_exactly_one_bos(family: str, bos_id: int, request: pytest.FixtureRequest) -> None:
    template: ChatTemplate = request.getfixturevalue(family)
    tokenizer: Tokenizer = request.getfixturevalue(f"{family}_tokenizer")
    ids = tokenizer.encode(template.render(SYSTEM_USER), add_special_tokens=False)
    assert ids[0] == bos_id
    assert ids.count(bos_id) == 1


@pytest.mark.parametrize("family", ["llama3", "deepseek"])
def test_content_parts_render_like_joined_text(family: str, request: pytest.FixtureRequest) -> None:
    template: ChatTemplate = request.getfixturevalue(family)
    parts = [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}]
    assert template.render([{"role": "user", "content": parts}]) == template.render(
        [{"role": "user", "content": "first\nsecond"}]
    )
    image = [{"type": "image_url", "image_url": {"url": "data:,"}}]
    with pytest.raises(TemplateError, match="only text content parts, not 'image_url'"):
        template.render([{"role": "user", "content": image}])


@pytest.mark.parametrize("family", ["llama3", "deepseek"])
def test_tools_reach_the_prompt(family: str, request: pytest.FixtureRequest) -> None:
    template: ChatTemplate = request.getfixturevalue(family)
    prompt = template.render(SYSTEM_USER, tools=[WEATHER_TOOL])
    assert "get_weather" in prompt
    assert "Current weather for a city" in prompt
    assert '"city"' in prompt  # the parameter schema
    assert "You are a helpful assistant." in prompt
    assert "get_weather" not in template.render(SYSTEM_USER)


def test_llama3_tools_go_in_the_system_turn(llama3: ChatTemplate) -> None:
    prompt = llama3.render(SYSTEM_USER, tools=[WEATHER_TOOL])
    system_turn = prompt.split("<|eot_id|>")[0]
    assert system_turn.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython")
    assert json.dumps(WEATHER_TOOL, indent=4) in system_turn
    assert system_turn.endswith("You are a helpful assistant.")


def test_llama3_tool_call_and_result(llama3: ChatTemplate) -> None:
    as_string = {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    as_object = {"name": "get_weather", "arguments": {"city": "Paris"}}
    rendered = [
        llama3.render(
            [
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": fn}]},
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            ],
            add_generation_prompt=False,
        )
        for fn in (as_string, as_object)
    ]
    assert rendered[0] == rendered[1]
    assert rendered[0].endswith(
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
        '{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>'
        "<|start_header_id|>ipython<|end_header_id|>\n\nsunny<|eot_id|>"
    )


# --- DeepSeek-V3 ---


def test_deepseek_matches_published_format(deepseek: ChatTemplate) -> None:
    assert deepseek.render(SYSTEM_USER) == (
        "<｜begin▁of▁sentence｜>You are a helpful assistant.<｜User｜>Hello!<｜Assistant｜>"
    )
    multi = [*SYSTEM_USER, {"role": "assistant", "content": "Hi."}, {"role": "user", "content": "Bye"}]
    assert deepseek.render(multi, add_generation_prompt=False) == (
        "<｜begin▁of▁sentence｜>You are a helpful assistant.<｜User｜>Hello!"
        "<｜Assistant｜>Hi.<｜end▁of▁sentence｜><｜User｜>Bye"
    )


def test_deepseek_tool_calls_and_outputs(deepseek: ChatTemplate, deepseek_tokenizer: Tokenizer) -> None:
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
    }
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": [call, call]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c1", "content": "rainy"},
    ]
    block = '<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{"city":"Paris"}\n```<｜tool▁call▁end｜>'
    prompt = deepseek.render(messages)
    assert prompt == (
        "<｜begin▁of▁sentence｜><｜User｜>Weather?<｜Assistant｜>"
        f"<｜tool▁calls▁begin｜>{block}\n{block}<｜tool▁calls▁end｜><｜end▁of▁sentence｜>"
        "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>sunny<｜tool▁output▁end｜>\n"
        "<｜tool▁output▁begin｜>rainy<｜tool▁output▁end｜><｜tool▁outputs▁end｜>"
    )
    ids = deepseek_tokenizer.encode(prompt, add_special_tokens=False)
    for marker in (
        "<｜tool▁calls▁begin｜>",
        "<｜tool▁sep｜>",
        "<｜tool▁outputs▁end｜>",
        "<｜User｜>",
        "<｜Assistant｜>",
    ):
        assert deepseek_tokenizer.token_to_id(marker) in ids, marker
    # After tool outputs the assistant answers without a new <｜Assistant｜>, as DeepSeek-V3 does.
    answered = deepseek.render([*messages, {"role": "assistant", "content": "Sunny."}], add_generation_prompt=False)
    assert answered.endswith("<｜tool▁outputs▁end｜>Sunny.<｜end▁of▁sentence｜>")


# --- the renderer's Hugging Face semantics ---


@pytest.mark.parametrize("family", ["llama3", "deepseek"])
def test_unknown_role_is_a_template_error(family: str, request: pytest.FixtureRequest) -> None:
    template: ChatTemplate = request.getfixturevalue(family)
    with pytest.raises(TemplateError, match="Unsupported message role 'narrator'"):
        template.render([{"role": "narrator", "content": "x"}])


def test_raise_exception_message_reaches_the_caller() -> None:
    template = plain(
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('Conversation must start with a user') }}{% endif %}"
    )
    with pytest.raises(TemplateError) as info:
        template.render([{"role": "assistant", "content": "x"}])
    assert info.value.message == "Conversation must start with a user"


def test_syntax_error_names_the_line() -> None:
    with pytest.raises(TemplateError, match="line 2"):
        plain("ok\n{% if %}")


@pytest.mark.parametrize(
    "source",
    [
        "{{ messages[0].content.missing.deeper }}",  # undefined
        "{{ messages.append(1) }}",  # the sandbox is immutable
        "{{ messages[0]['content'] + 1 }}",  # TypeError inside the template
    ],
)
def test_render_failures_become_template_errors(source: str) -> None:
    with pytest.raises(TemplateError, match="failed to render"):
        plain(source).render([{"role": "user", "content": "x"}])


def test_malformed_content_is_a_template_error(llama3: ChatTemplate) -> None:
    with pytest.raises(TemplateError):
        llama3.render([{"role": "user", "content": 5}])


def test_tojson_like_transformers() -> None:
    template = plain("{{ tools[0] | tojson }}|{{ tools[0] | tojson(indent=2) }}")
    value: dict[str, Any] = {"q": "<a & 'b'>", "u": "é"}
    assert (
        template.render([], tools=[value])
        == f"{json.dumps(value, ensure_ascii=False)}|{json.dumps(value, ensure_ascii=False, indent=2)}"
    )


def test_environment_options() -> None:
    # trim_blocks/lstrip_blocks drop the block lines; loopcontrols allows break; bos/eos are variables.
    source = (
        "{{ bos_token }}\n"
        "  {% for m in messages %}\n"
        "{% if loop.index > 1 %}{% break %}{% endif %}{{ m.content }}\n"
        "{% endfor %}"
        "{{ eos_token }}"
    )
    messages = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    assert plain(source).render(messages) == "<s>\na\n</s>"


def test_strftime_now_uses_the_injected_clock() -> None:
    template = ChatTemplate(
        "{{ strftime_now('%d %b %Y') }}", bos_token=None, eos_token=None, now=lambda: datetime(2024, 7, 26)
    )
    assert template.render([]) == "26 Jul 2024"


def test_unset_special_token_is_undefined() -> None:
    template = ChatTemplate(
        "[{{ bos_token }}]{% if eos_token is defined %}eos{% endif %}", bos_token=None, eos_token=None
    )
    assert template.render([]) == "[]"


def test_extra_variables_and_reserved_names() -> None:
    template = plain("{{ 'think' if enable_thinking else 'plain' }}|{{ add_generation_prompt }}")
    assert template.render([], extra={"enable_thinking": True}) == "think|True"
    assert template.render([], add_generation_prompt=False) == "plain|False"
    with pytest.raises(TemplateError, match="may not override bos_token, messages"):
        template.render([], extra={"messages": [], "bos_token": ""})
