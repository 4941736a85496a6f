"""SSE write coalescing: frames that are ready together leave in one write, the end of a stream in one more,
and the bytes are exactly the frames in order. A client that disconnects still aborts its worker request."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Iterator
from pathlib import Path

import aiohttp
import msgspec
import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.http_writer import StreamWriter
from aiohttp.web_protocol import RequestHandler

from node.http.sse import DONE, SseResponse, SseStream
from tests.http.conftest import Cluster, start_cluster

pytestmark = pytest.mark.asyncio(loop_scope="module")

TOKENS_PER_CHUNK = 4
NEVER = "@@never matches@@"  # a stop string: the answer is matched per token, so one message makes several deltas


class FakeBody:
    def __init__(self) -> None:
        self.calls: list[tuple[str, bytes]] = []

    async def write(self, data: bytes) -> None:
        self.calls.append(("write", data))

    async def write_eof(self, data: bytes = b"") -> None:
        self.calls.append(("eof", data))


async def test_frames_added_together_leave_in_one_write() -> None:
    body = FakeBody()
    out = SseStream(body)
    await out.flush()
    assert body.calls == []  # nothing added, nothing written
    out.add(b"data: 1\n\n")
    await out.flush()
    out.add(b"data: 2\n\n")
    out.add(b"data: 3\n\n")
    await out.flush()
    out.add(b"data: 4\n\n")
    await out.close()
    assert body.calls == [
        ("write", b"data: 1\n\n"),
        ("write", b"data: 2\n\ndata: 3\n\n"),
        ("eof", b"data: 4\n\n" + DONE),
    ]


async def test_close_with_nothing_pending_still_ends_the_body() -> None:
    body = FakeBody()
    await SseStream(body).close()
    assert body.calls == [("eof", DONE)]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def chunky(llama3_model_dir: Path) -> AsyncIterator[Cluster]:
    async with start_cluster(llama3_model_dir, workers=1, tokens_per_chunk=TOKENS_PER_CHUNK) as c:
        yield c


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, bytes]]]:
    """Every body write of every StreamResponse in this process (the node runs in the test's loop), and every
    write of the push path ("push": frames sent from the worker connection's receive callback)."""
    calls: list[tuple[str, bytes]] = []
    write, write_eof = web.StreamResponse.write, web.StreamResponse.write_eof

    async def counted_write(self: web.StreamResponse, data: bytes | bytearray | memoryview) -> None:
        calls.append(("write", bytes(data)))
        await write(self, data)

    async def counted_write_eof(self: web.StreamResponse, data: bytes = b"") -> None:
        if not self._eof_sent:  # aiohttp calls it again after the handler returns; that one sends nothing
            calls.append(("eof", bytes(data)))
        await write_eof(self, data)

    write_now = SseResponse.write_now

    def counted_write_now(self: SseResponse, data: bytes) -> None:
        calls.append(("push", bytes(data)))
        write_now(self, data)

    monkeypatch.setattr(web.StreamResponse, "write", counted_write)
    monkeypatch.setattr(web.StreamResponse, "write_eof", counted_write_eof)
    monkeypatch.setattr(SseResponse, "write_now", counted_write_now)
    yield calls


def _events(raw: bytes) -> list[bytes]:
    assert raw.endswith(b"\n\n")
    events = raw.split(b"\n\n")[:-1]
    assert all(e.startswith(b"data: ") for e in events), events
    return [e[len(b"data: ") :] for e in events]


async def _post(url: str, body: dict[str, object]) -> bytes:
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.read()


@pytest.mark.parametrize("api", ["chat", "completions"])
async def test_a_stream_is_one_write_per_worker_message_and_one_for_its_end(
    chunky: Cluster, writes: list[tuple[str, bytes]], api: str
) -> None:
    max_tokens = 3 * TOKENS_PER_CHUNK
    common: dict[str, object] = {
        "model": chunky.model,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "stop": [NEVER],
        "seed": 7,
    }
    if api == "chat":
        url, body = "/v1/chat/completions", {**common, "messages": [{"role": "user", "content": "Tell a story."}]}
    else:
        url, body = "/v1/completions", {**common, "prompt": "Once upon a time"}
    raw = await _post(chunky.node.url + url, body)

    # The client got exactly the written bytes, in order.
    assert b"".join(data for _, data in writes) == raw
    events = _events(raw)
    assert events[-1] == b"[DONE]"
    chunks = [msgspec.json.decode(e) for e in events[:-1]]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == max_tokens
    text_key = "delta" if api == "chat" else "text"
    finishes = [c for c in chunks[:-1] if c["choices"][0]["finish_reason"] is not None]
    assert [c["choices"][0]["finish_reason"] for c in finishes] == ["length"]

    # One write per worker message with text (the first with the role chunk), then one that ends the body:
    # the finish chunk, the usage chunk and [DONE] together.
    kinds = [kind for kind, _ in writes]
    assert kinds[-1] == "eof" and kinds.count("eof") == 1
    assert len(writes) <= max_tokens // TOKENS_PER_CHUNK + 1
    assert len(events) > len(writes) + 2, "several frames per write"
    last = _events(writes[-1][1])
    assert last[-1] == b"[DONE]" and b'"usage":{' in last[-2] and b'"finish_reason":"length"' in last[-3]
    if api == "chat":
        assert b'"role":"assistant"' in _events(writes[0][1])[0]
        assert len(_events(writes[0][1])) > 1, "the role chunk leaves with the first content"
    content = [c["choices"][0][text_key] for c in chunks[:-1]]
    assert all(isinstance(piece, (dict, str)) for piece in content)


async def test_the_streamed_text_matches_the_non_streamed_answer(chunky: Cluster) -> None:
    body: dict[str, object] = {
        "model": chunky.model,
        "messages": [{"role": "user", "content": "Tell a story."}],
        "max_tokens": 10,
        "ignore_eos": True,
        "seed": 11,
    }
    url = chunky.node.url + "/v1/chat/completions"
    whole = msgspec.json.decode(await _post(url, body))["choices"][0]["message"]["content"]
    events = _events(await _post(url, {**body, "stream": True}))
    streamed = "".join(
        c["choices"][0]["delta"].get("content") or ""
        for c in (msgspec.json.decode(e) for e in events[:-1])
        if c["choices"]
    )
    assert streamed == whole


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def slow(llama3_model_dir: Path) -> AsyncIterator[Cluster]:
    async with start_cluster(llama3_model_dir, workers=1, tpot_ms=20.0, tokens_per_chunk=2) as c:
        yield c


@pytest.mark.parametrize("api", ["chat", "completions"])
async def test_a_client_that_disconnects_still_aborts_the_worker_request(slow: Cluster, api: str) -> None:
    common: dict[str, object] = {"model": slow.model, "max_tokens": 2000, "ignore_eos": True, "stream": True}
    if api == "chat":
        url, body = "/v1/chat/completions", {**common, "messages": [{"role": "user", "content": "A long story."}]}
    else:
        url, body = "/v1/completions", {**common, "prompt": "A long story"}
    engine = slow.sims[0].engine
    async with aiohttp.ClientSession() as session:
        resp = await session.post(slow.node.url + url, json=body)
        assert resp.status == 200
        request_id = ""
        async for line in resp.content:
            if line.startswith(b"data: {"):
                request_id = msgspec.json.decode(line[6:])["id"]
                break
        assert request_id in engine.active_request_ids
        resp.connection.transport.abort()  # type: ignore[union-attr]  # the client vanishes
        for _ in range(2000):
            if request_id in engine.aborted_request_ids:
                break
            await asyncio.sleep(0.001)
        resp.close()
    assert request_id in engine.aborted_request_ids


async def test_the_status_line_and_headers_leave_with_the_first_frames(
    chunky: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each transport write of a streamed response is a send system call: the headers do not take one alone."""
    sent: list[bytes] = []
    write, writelines = StreamWriter._write, StreamWriter._writelines

    def counted_write(self: StreamWriter, chunk: bytes) -> None:
        if isinstance(self.protocol, RequestHandler):  # the node's side, not the test client's
            sent.append(bytes(chunk))
        write(self, chunk)

    def counted_writelines(self: StreamWriter, chunks: Iterable[bytes]) -> None:
        chunks = [bytes(c) for c in chunks]
        if isinstance(self.protocol, RequestHandler):
            sent.append(b"".join(chunks))
        writelines(self, chunks)

    monkeypatch.setattr(StreamWriter, "_write", counted_write)
    monkeypatch.setattr(StreamWriter, "_writelines", counted_writelines)
    body = {
        "model": chunky.model,
        "messages": [{"role": "user", "content": "Tell a story."}],
        "max_tokens": 3 * TOKENS_PER_CHUNK,
        "ignore_eos": True,
        "stream": True,
    }
    raw = await _post(chunky.node.url + "/v1/chat/completions", body)
    assert sent[0].startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"\r\ncontent-type: text/event-stream\r\n" in sent[0].lower()
    assert b'data: {"id":' in sent[0] and b'"role":"assistant"' in sent[0], "headers went out alone"
    assert raw.endswith(DONE) and len(sent) <= 3 + 1


def _text(chunks: list[dict[str, object]], api: str) -> str:
    pieces = []
    for c in chunks:
        choices = c["choices"]
        assert isinstance(choices, list)
        if choices:
            pieces.append((choices[0]["delta"].get("content") or "") if api == "chat" else choices[0]["text"])
    return "".join(pieces)


@pytest.mark.parametrize("api", ["chat", "completions"])
async def test_a_steady_stream_is_pushed_and_a_stop_string_ends_it_there(
    slow: Cluster, writes: list[tuple[str, bytes]], api: str
) -> None:
    """Tokens that arrive apart (20 ms) go out from the worker connection's receive callback (the push path):
    the client gets the same bytes, in order, as the non-streamed answer's text; a stop string met there ends
    the choice at the stop, with "stop", and the worker request is aborted."""
    common: dict[str, object] = {"model": slow.model, "max_tokens": 24, "ignore_eos": True, "seed": 5}
    if api == "chat":
        url, body = "/v1/chat/completions", {**common, "messages": [{"role": "user", "content": "Tell a story."}]}
    else:
        url, body = "/v1/completions", {**common, "prompt": "Once upon a time"}
    url = slow.node.url + url
    answer = msgspec.json.decode(await _post(url, body))["choices"][0]
    whole = answer["message"]["content"] if api == "chat" else answer["text"]
    writes.clear()
    raw = await _post(url, {**body, "stream": True})
    assert b"".join(data for _, data in writes) == raw
    kinds = [kind for kind, _ in writes]
    assert kinds[0] == "write" and kinds[-1] == "eof"
    assert kinds.count("push") >= 6, kinds  # the first token went by the handler's loop, with the headers
    assert _text([msgspec.json.decode(e) for e in _events(raw)[:-1]], api) == whole

    words = whole.split()
    stop = words[len(words) // 2]
    cut = whole.index(stop)  # its first occurrence, which is where the stream must end
    assert cut > 0
    writes.clear()
    engine = slow.sims[0].engine
    aborted = set(engine.aborted_request_ids)
    raw = await _post(url, {**body, "stream": True, "stop": [stop]})
    chunks = [msgspec.json.decode(e) for e in _events(raw)[:-1]]
    assert _text(chunks, api) == whole[:cut]
    reasons = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert reasons == ["stop"]
    assert "push" in [kind for kind, _ in writes]
    for _ in range(500):
        if set(engine.aborted_request_ids) - aborted:
            break
        await asyncio.sleep(0.002)
    assert set(engine.aborted_request_ids) - aborted, "the worker request was aborted at the stop"
