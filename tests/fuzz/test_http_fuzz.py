"""HTTP fuzz tier: mutated requests of every POST endpoint, and raw bytes at the port, against a real node.

What must hold for every case: no 5xx (a client cannot make the node fail), every 4xx carries OpenAI's JSON
envelope, and afterwards the node is alive (/health answers quickly) with its peak RSS bounded. A few hundred
cases run by default; the `slow` variants run thousands.
"""

from __future__ import annotations

import gzip
import http.client
import json
import socket
import time
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz.conftest import NodeProcess
from tests.fuzz.payloads import vm_hwm_mb

# Peak RSS the node may reach over a whole fuzz run: a loaded 128k-vocabulary tokenizer is ~200 MB of it.
MAX_NODE_RSS_MB = 600

EXTREME_INTS = [2**31 - 1, 2**31, 2**32, 2**63, 2**64, -(2**31) - 1, -(2**63), 10**30]
FIELD_NAMES = [
    "model", "messages", "prompt", "input", "n", "max_tokens", "max_completion_tokens", "max_output_tokens",
    "stop", "stop_token_ids", "top_k", "top_p", "temperature", "min_tokens", "seed", "logprobs", "top_logprobs",
    "stream", "stream_options", "tools", "tool_choice", "role", "content", "type", "text", "items", "metadata",
    "chat_template_kwargs", "echo", "best_of", "suffix", "instructions", "previous_response_id", "conversation",
    "store", "url", "labels", "name", "arguments", "function", "parameters", "tool_calls", "tool_call_id", "id",
    "include_usage", "ignore_eos", "repetition_penalty", "min_p", "continue_final_message",
]  # fmt: skip

leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.sampled_from(EXTREME_INTS),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
    st.sampled_from(["llama3", "user", "assistant", "tool", "system", "function", "message", "text", "\ud800"]),
)
json_values = st.recursive(
    leaves,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(FIELD_NAMES) | st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)

CHAT = {"model": "llama3", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
BASES: dict[str, list[dict[str, Any]]] = {
    "/v1/chat/completions": [
        CHAT,
        {**CHAT, "stream": True, "n": 2, "stop": ["x", "yz"], "stream_options": {"include_usage": True}},
        {**CHAT, "logprobs": True, "top_logprobs": 2, "seed": 1, "top_k": 5},
        {
            **CHAT,
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c", "content": "1"},
            ],
        },
    ],
    "/v1/completions": [
        {"model": "llama3", "prompt": "hi", "max_tokens": 2},
        {"model": "llama3", "prompt": [[1, 2], [3]], "max_tokens": 2, "logprobs": 1, "echo": True, "stream": True},
    ],
    "/v1/responses": [
        {"model": "llama3", "input": "hi", "max_output_tokens": 2},
        {
            "model": "llama3",
            "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
            "max_output_tokens": 2,
            "stream": True,
            "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        },
    ],
    "/v1/conversations": [{"items": [{"type": "message", "role": "user", "content": "hi"}], "metadata": {"a": "b"}}],
    "/v1/conversations/{conv}/items": [{"items": [{"type": "message", "role": "user", "content": "hi"}]}],
    "/v1/conversations/{conv}": [{"metadata": {"k": "v"}}],
    # Harmless subset: the URL is never a grpc:// one, so no worker is ever registered.
    "/workers": [{"url": "http://not-a-worker:1", "model": "llama3", "role": "regular", "labels": {"a": "b"}}],
}


@st.composite
def mutated(draw: st.DrawFn, value: Any, depth: int = 0) -> Any:
    """``value`` with one random change somewhere inside it (replace, delete, insert, or recurse)."""
    action = draw(st.sampled_from(["replace", "recurse", "recurse", "delete", "insert"]))
    if action == "replace" or not isinstance(value, dict | list) or depth > 4:
        return draw(json_values)
    if isinstance(value, dict):
        if action == "insert" or not value:
            return {**value, draw(st.sampled_from(FIELD_NAMES)): draw(json_values)}
        key = draw(st.sampled_from(sorted(value)))
        if action == "delete":
            return {k: v for k, v in value.items() if k != key}
        return {**value, key: draw(mutated(value[key], depth + 1))}
    if action == "insert" or not value:
        return [*value, draw(json_values)]
    i = draw(st.integers(0, len(value) - 1))
    if action == "delete":
        return value[:i] + value[i + 1 :]
    return [*value[:i], draw(mutated(value[i], depth + 1)), *value[i + 1 :]]


@st.composite
def post_cases(draw: st.DrawFn) -> tuple[str, bytes, dict[str, str]]:
    """(path, body, headers): a valid request mutated as JSON, then perhaps as bytes or in its encoding."""
    path = draw(st.sampled_from(sorted(BASES)))
    body: Any = draw(st.sampled_from(BASES[path]))
    for _ in range(draw(st.integers(0, 3))):
        body = draw(mutated(body))
    if path == "/workers" and isinstance(body, dict) and str(body.get("url", "")).startswith("grpc"):
        body = {**body, "url": "http://not-a-worker:1"}
    raw = json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    damage = draw(st.sampled_from(["none"] * 6 + ["truncate", "bytes", "utf8", "nest", "gzip", "bad-gzip", "br"]))
    if damage == "truncate":
        raw = raw[: draw(st.integers(0, len(raw)))]
    elif damage == "bytes":
        at = draw(st.integers(0, len(raw)))
        raw = raw[:at] + draw(st.binary(min_size=1, max_size=4)) + raw[at:]
    elif damage == "utf8":
        raw = raw.replace(b'"hi"', b'"h\xff\xfei"')
    elif damage == "nest":
        depth = draw(st.sampled_from([65, 1000, 100_000]))
        raw = raw.replace(b'"hi"', b"[" * depth + b"]" * depth, 1) if b'"hi"' in raw else b"[" * depth + raw
    elif damage in ("gzip", "bad-gzip", "br"):
        headers["Content-Encoding"] = "br" if damage == "br" else "gzip"
        raw = gzip.compress(raw) if damage == "gzip" else raw
    return path, raw, headers


def _check_answer(status: int, body: bytes, what: str) -> None:
    assert status < 500, f"{what}: {status} {body[:300]!r}"
    if 400 <= status < 500:
        err = json.loads(body)["error"]
        assert set(err) - {"request_id"} == {"message", "type", "param", "code"}, what
        assert isinstance(err["message"], str) and err["message"] and "Traceback" not in err["message"], what


def _request(
    node: NodeProcess, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(node.host, node.port, timeout=60)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


@pytest.fixture(scope="module")
def conversation(node_process: NodeProcess) -> str:
    status, body = _request(node_process, "POST", "/v1/conversations", b"{}", {"Content-Type": "application/json"})
    assert status == 200, body
    return str(json.loads(body)["id"])


def _alive_and_bounded(node: NodeProcess) -> None:
    start = time.monotonic()
    status, body = _request(node, "GET", "/health")
    assert status == 200 and json.loads(body)["pid"] == node.pid
    assert time.monotonic() - start < 2.0
    assert vm_hwm_mb(node.pid) < MAX_NODE_RSS_MB


def _post_case(node: NodeProcess, conversation: str) -> Callable[[tuple[str, bytes, dict[str, str]]], None]:
    def run(case: tuple[str, bytes, dict[str, str]]) -> None:
        path, raw, headers = case
        status, body = _request(node, "POST", path.format(conv=conversation), raw, headers)
        _check_answer(status, body, f"POST {path} {raw[:200]!r} {headers}")

    return run


FAST = settings(max_examples=250, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
SLOW = settings(max_examples=4000, deadline=None, suppress_health_check=list(HealthCheck))


def test_mutated_requests_get_no_5xx_and_4xx_in_the_envelope(node_process: NodeProcess, conversation: str) -> None:
    FAST(given(post_cases())(_post_case(node_process, conversation)))()
    _alive_and_bounded(node_process)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_mutated_requests_thousands(node_process: NodeProcess, conversation: str) -> None:
    SLOW(given(post_cases())(_post_case(node_process, conversation)))()
    _alive_and_bounded(node_process)


# --- raw bytes at the port ------------------------------------------------------------------------------

METHODS = [b"GET", b"POST", b"PUT", b"DELETE", b"OPTIONS", b"PATCH", b"G\x00T", b"", b"GARBAGE", b"\x16\x03\x01"]
PATHS = [
    b"/health",
    b"/v1/chat/completions",
    b"/v1/models",
    b"/workers",
    b"/v1/models/%ff",
    b"*",
    b"",
    b"/" + b"a" * 9000,
]


@st.composite
def raw_requests(draw: st.DrawFn) -> tuple[bytes, bytes]:
    """(method, bytes): a request line, headers and body, each perhaps broken, perhaps with random bytes."""
    method = draw(st.sampled_from(METHODS))
    line = (
        method
        + b" "
        + draw(st.sampled_from(PATHS))
        + b" "
        + draw(st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/9.9", b""]))
    )
    headers = [b"Host: x"]
    names = st.sampled_from(
        [b"Content-Length", b"Transfer-Encoding", b"Content-Encoding", b"Content-Type", b"X-A" * 3000]
    )
    values = st.sampled_from([b"5", b"-1", b"abc", b"chunked", b"gzip", b"application/json", b"a" * 9000, b"1\r\nX: y"])
    headers += [n + b": " + v for n, v in draw(st.lists(st.tuples(names, values), max_size=3))]
    headers += [b"X-%d: y" % i for i in range(draw(st.sampled_from([0, 0, 200])))]
    body = draw(st.sampled_from([b"", b'{"model":"llama3"}', b"0\r\n\r\n", b"\xff" * 10]))
    raw = line + b"\r\n" + b"\r\n".join(headers) + b"\r\n\r\n" + body
    if draw(st.booleans()):
        at = draw(st.integers(0, len(raw)))
        raw = raw[:at] + draw(st.binary(max_size=16)) + raw[at + draw(st.integers(0, 4)) :]
    return method, raw


def _raw_case(node: NodeProcess) -> Callable[[tuple[bytes, bytes]], None]:
    def run(case: tuple[bytes, bytes]) -> None:
        method, raw = case
        with socket.create_connection((node.host, node.port), timeout=5) as sock:
            sock.sendall(raw)
            sock.shutdown(socket.SHUT_WR)  # the node sees the end at once: no waiting for a body that never comes
            answer = b""
            try:
                while chunk := sock.recv(65536):
                    answer += chunk
            except (TimeoutError, ConnectionResetError):
                pass
        if not answer.startswith(b"HTTP/1."):
            return  # the node may close a broken connection without answering
        head, _, body = answer.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        if method == b"HEAD" or b"chunked" in head.lower() or not 400 <= status < 500:
            assert status < 500, f"{raw[:200]!r}: {head!r}"
            return
        _check_answer(status, body, f"{raw[:200]!r}")

    return run


def test_raw_bytes_get_no_5xx_and_4xx_in_the_envelope(node_process: NodeProcess) -> None:
    settings(FAST, max_examples=150)(given(raw_requests())(_raw_case(node_process)))()
    _alive_and_bounded(node_process)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_raw_bytes_thousands(node_process: NodeProcess) -> None:
    settings(SLOW, max_examples=3000)(given(raw_requests())(_raw_case(node_process)))()
    _alive_and_bounded(node_process)
