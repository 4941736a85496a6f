"""Responses/Conversations items: validate client items into their stored form, and turn items into the chat
messages a Hugging Face chat template renders.

Pure: ids come from an injected factory, nothing here does I/O. Stored items are the canonical OpenAI shapes
(a message's content is always a list of parts; every item has an `id`, a `type` and a `status`), so items read
back from storage, from a previous_response_id chain or from a conversation render exactly like new ones.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgspec

from node.errors import InvalidRequest

IdFactory = Callable[[str], str]  # prefix -> fresh id, e.g. "msg" -> "msg_3f9a..."

MESSAGE_ROLES = ("user", "assistant", "system", "developer")
SUPPORTED_TYPES = ("message", "function_call", "function_call_output", "reasoning")
TEXT_PART_TYPES = ("input_text", "output_text", "text")
# Storage accepts item ids of up to 256 characters (they are pagination cursors).
MAX_ITEM_ID_CHARS = 256
# Prefix of minted ids per item type, as OpenAI's ids look.
ID_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}


def _str_field(item: Mapping[str, Any], key: str, where: str, *, required: bool = True) -> str | None:
    value = item.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str):
        what = "Missing required parameter" if value is None else "Expected a string for"
        raise InvalidRequest(f"{what}: '{where}.{key}'.", param=f"{where}.{key}")
    return value


def _item_id(item: Mapping[str, Any], kind: str, where: str, new_id: IdFactory) -> str:
    given = _str_field(item, "id", where, required=False)
    if given is None:
        return new_id(ID_PREFIX[kind])
    if not 0 < len(given) <= MAX_ITEM_ID_CHARS:
        raise InvalidRequest(f"'{where}.id' must be 1..{MAX_ITEM_ID_CHARS} characters.", param=f"{where}.id")
    return given


def _text_parts(content: Any, where: str, *, assistant: bool) -> list[dict[str, Any]]:
    """Message content (a string or a list of text parts) as canonical parts."""
    out_type = "output_text" if assistant else "input_text"
    if isinstance(content, str):
        texts = [content]
    elif isinstance(content, list):
        texts = []
        for k, part in enumerate(content):
            at = f"{where}.content[{k}]"
            if not isinstance(part, dict):
                raise InvalidRequest(f"'{at}' must be an object.", param=at)
            kind = part.get("type")
            if kind not in TEXT_PART_TYPES:
                raise InvalidRequest(
                    f"Content parts of type {kind!r} are not supported by this model; only "
                    f"{', '.join(TEXT_PART_TYPES)} are.",
                    param=f"{at}.type",
                )
            texts.append(_str_field(part, "text", at) or "")
    else:
        raise InvalidRequest(
            f"'{where}.content' must be a string or a list of content parts.", param=f"{where}.content"
        )
    if assistant:
        return [{"type": out_type, "text": t, "annotations": []} for t in texts]
    return [{"type": out_type, "text": t} for t in texts]


def _message(item: Mapping[str, Any], where: str, new_id: IdFactory) -> dict[str, Any]:
    role = item.get("role")
    if role not in MESSAGE_ROLES:
        raise InvalidRequest(
            f"'{where}.role' must be one of {', '.join(MESSAGE_ROLES)}, got {role!r}.", param=f"{where}.role"
        )
    if "content" not in item:
        raise InvalidRequest(f"Missing required parameter: '{where}.content'.", param=f"{where}.content")
    return {
        "id": _item_id(item, "message", where, new_id),
        "type": "message",
        "role": role,
        "status": "completed",
        "content": _text_parts(item["content"], where, assistant=role == "assistant"),
    }


def _output_text(output: Any, where: str) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return "".join(p["text"] for p in _text_parts(output, where, assistant=False))
    raise InvalidRequest(f"'{where}.output' must be a string or a list of content parts.", param=f"{where}.output")


def normalize_item(raw: Any, where: str, new_id: IdFactory) -> dict[str, Any]:
    """One client item in its stored form. Raises InvalidRequest naming the offending field."""
    if not isinstance(raw, dict):
        raise InvalidRequest(f"'{where}' must be an object.", param=where)
    kind = raw.get("type", "message")
    if kind == "message":
        return _message(raw, where, new_id)
    if kind == "function_call":
        return {
            "id": _item_id(raw, kind, where, new_id),
            "type": kind,
            "status": "completed",
            "call_id": _str_field(raw, "call_id", where),
            "name": _str_field(raw, "name", where),
            "arguments": _str_field(raw, "arguments", where),
        }
    if kind == "function_call_output":
        if "output" not in raw:
            raise InvalidRequest(f"Missing required parameter: '{where}.output'.", param=f"{where}.output")
        return {
            "id": _item_id(raw, kind, where, new_id),
            "type": kind,
            "status": "completed",
            "call_id": _str_field(raw, "call_id", where),
            "output": _output_text(raw["output"], where),
        }
    if kind == "reasoning":
        # A reasoning item a client replays from an earlier output (store=false): kept as context, not
        # rendered (chat templates drop earlier turns' reasoning).
        summary, content = raw.get("summary", []), raw.get("content", [])
        if not isinstance(summary, list) or not isinstance(content, list):
            raise InvalidRequest(f"'{where}.summary' and '{where}.content' must be lists.", param=where)
        return {
            "id": _item_id(raw, kind, where, new_id),
            "type": kind,
            "status": "completed",
            "summary": summary,
            "content": content,
        }
    raise InvalidRequest(
        f"Items of type {kind!r} are not supported; supported types: {', '.join(SUPPORTED_TYPES)}.",
        param=f"{where}.type",
    )


def normalize_input(raw: str | Sequence[Any], new_id: IdFactory, *, param: str = "input") -> list[dict[str, Any]]:
    """A request's `input` (a string is one user message) as stored items. Raises InvalidRequest."""
    if isinstance(raw, str):
        return [_message({"role": "user", "content": raw}, param, new_id)]
    items = [normalize_item(item, f"{param}[{i}]", new_id) for i, item in enumerate(raw)]
    seen: set[str] = set()
    for i, item in enumerate(items):
        if item["id"] in seen:
            raise InvalidRequest(f"Duplicate item id {item['id']!r} in '{param}'.", param=f"{param}[{i}].id")
        seen.add(item["id"])
    return items


def output_message(item_id: str, text: str, *, status: str = "completed") -> dict[str, Any]:
    """The assistant message item of a response."""
    return {
        "id": item_id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }


def _arguments(raw: str) -> Any:
    """Templates expect tool-call arguments as a mapping (they `tojson` them); invalid JSON stays text."""
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return raw


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _reasoning_text(item: Mapping[str, Any]) -> str:
    parts = item.get("content")
    if not isinstance(parts, list):
        return ""
    return "".join(p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))


def chat_messages(items: Sequence[Mapping[str, Any]], *, instructions: str | None = None) -> list[dict[str, Any]]:
    """Items (stored form) as chat-template messages: function calls become an assistant turn's tool_calls,
    their outputs tool messages; `developer` is rendered as `system` (chat templates know only the latter).
    A reasoning item becomes the `reasoning_content` of the assistant turn that follows it (templates that
    render reasoning, such as Qwen3's for the turns of an unfinished tool loop, read it). Items of other
    types are skipped."""
    out: list[dict[str, Any]] = []
    if instructions:
        out.append({"role": "system", "content": instructions})
    reasoning = ""  # a reasoning item's text, waiting for its assistant turn
    for item in items:
        kind = item.get("type")
        if kind == "reasoning":
            reasoning += _reasoning_text(item)
            continue
        if kind == "message":
            role = item.get("role")
            message = {"role": "system" if role == "developer" else role, "content": _content_text(item.get("content"))}
            if role == "assistant" and reasoning:
                message["reasoning_content"] = reasoning
            out.append(message)
        elif kind == "function_call":
            call = {
                "id": item.get("call_id", ""),
                "type": "function",
                "function": {"name": item.get("name", ""), "arguments": _arguments(item.get("arguments", ""))},
            }
            # A call right after an assistant turn belongs to that turn (content and tool_calls together).
            if out and out[-1]["role"] == "assistant" and not reasoning:
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                message = {"role": "assistant", "content": None, "tool_calls": [call]}
                if reasoning:
                    message["reasoning_content"] = reasoning
                out.append(message)
        elif kind == "function_call_output":
            out.append({"role": "tool", "tool_call_id": item.get("call_id", ""), "content": item.get("output", "")})
        reasoning = ""
    return out


def normalize_tools(raw: Sequence[Any] | None) -> list[dict[str, Any]]:
    """Responses function tools (`{type, name, description, parameters, strict}`) as echoed on the response.
    Raises InvalidRequest naming the field; only function tools exist on a self-hosted model."""
    tools: list[dict[str, Any]] = []
    for i, tool in enumerate(raw or ()):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise InvalidRequest(f"'{where}' must be an object.", param=where)
        if tool.get("type") != "function":
            raise InvalidRequest(
                f"Tools of type {tool.get('type')!r} are not supported; only 'function' tools are.",
                param=f"{where}.type",
            )
        parameters = tool.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise InvalidRequest(f"'{where}.parameters' must be a JSON schema object.", param=f"{where}.parameters")
        description = _str_field(tool, "description", where, required=False)
        tools.append(
            {
                "type": "function",
                "name": _str_field(tool, "name", where),
                "description": description,
                "parameters": parameters,
                "strict": bool(tool.get("strict", True)),
            }
        )
    return tools


def chat_tools(tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]] | None:
    """Normalized tools in the chat-completions shape chat templates read."""
    if not tools:
        return None
    out = []
    for tool in tools:
        function: dict[str, Any] = {"name": tool["name"]}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        if tool.get("parameters") is not None:
            function["parameters"] = tool["parameters"]
        out.append({"type": "function", "function": function})
    return out
