"""The sans-IO HTTP/2 server core of the simulated engine: what a gRPC client sends in, what it gets back."""

from __future__ import annotations

from typing import Any

import hpack
from hypothesis import given, settings
from hypothesis import strategies as st

from node.sim.h2_server import (
    LOCAL_WINDOW,
    CallError,
    CallReady,
    CallReset,
    ServerConnection,
    WindowOpened,
)
from node.workers import h2_frames as f
from node.workers.grpc_wire import encode_message

PATH = "/vllm.grpc.engine.VllmEngine/Generate"


def request_headers(path: str = PATH, encoder: hpack.Encoder | None = None) -> bytes:
    encoder = encoder or hpack.Encoder()
    headers = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", "w:1"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]
    return bytes(encoder.encode(headers))  # Huffman and dynamic-table entries, as grpc-core and hyper send


def client_start(settings_: dict[int, int] | None = None) -> bytes:
    return f.PREFACE + f.settings_frame(settings_ or {})


def call(sid: int, message: bytes, path: str = PATH) -> bytes:
    return f.frame(f.HEADERS, f.FLAG_END_HEADERS, sid, request_headers(path)) + f.frame(
        f.DATA, f.FLAG_END_STREAM, sid, encode_message(message)
    )


class Peer:
    """What the client side reads back: frames, decoded header blocks."""

    def __init__(self) -> None:
        self.reader = f.FrameReader()
        self.decoder = hpack.Decoder()

    def frames(self, conn: ServerConnection) -> list[f.Frame]:
        return self.reader.feed(conn.data_to_send())

    def headers(self, fr: f.Frame) -> dict[str, str]:
        return {str(k): str(v) for k, v in self.decoder.decode(fr.payload, raw=False)}


def started(settings_: dict[int, int] | None = None, **kwargs: Any) -> tuple[ServerConnection, Peer]:
    conn = ServerConnection(max_message_bytes=kwargs.pop("max_message_bytes", 1 << 20), **kwargs)
    assert conn.receive_data(client_start(settings_)) == []
    peer = Peer()
    frames = peer.frames(conn)
    assert frames[0].kind == f.SETTINGS and not frames[0].flags & f.FLAG_ACK  # ours first
    assert any(fr.kind == f.SETTINGS and fr.flags & f.FLAG_ACK for fr in frames)  # then theirs acknowledged
    return conn, peer


def test_a_whole_request_makes_one_ready_call_with_its_path_and_message() -> None:
    conn, _ = started()
    events = conn.receive_data(call(1, b"hello"))
    assert events == [CallReady(1, PATH, b"hello")]


@settings(max_examples=60, deadline=None)
@given(
    messages=st.lists(st.binary(max_size=300), min_size=1, max_size=4),
    cuts=st.lists(st.integers(min_value=1, max_value=400), max_size=20),
    data_frames=st.integers(min_value=1, max_value=4),
)
def test_any_split_of_the_bytes_and_the_message_gives_the_same_calls(
    messages: list[bytes], cuts: list[int], data_frames: int
) -> None:
    """Frames cut anywhere across reads, a message cut across DATA frames: the same calls come out."""
    wire = client_start()
    for k, message in enumerate(messages):
        sid = 2 * k + 1
        body = encode_message(message)
        step = max(1, -(-len(body) // data_frames))
        pieces = [body[i : i + step] for i in range(0, len(body), step)]
        wire += f.frame(f.HEADERS, f.FLAG_END_HEADERS, sid, request_headers())
        wire += b"".join(f.frame(f.DATA, 0, sid, p) for p in pieces[:-1])
        wire += f.frame(f.DATA, f.FLAG_END_STREAM, sid, pieces[-1])
    conn = ServerConnection(max_message_bytes=1 << 20)
    events = []
    pos = 0
    for cut in cuts:
        events += conn.receive_data(wire[pos : pos + cut])
        pos += cut
    events += conn.receive_data(wire[pos:])
    assert events == [CallReady(2 * k + 1, PATH, m) for k, m in enumerate(messages)]
    assert conn.failed is None


def test_a_response_is_headers_messages_then_trailers() -> None:
    conn, peer = started()
    conn.receive_data(call(1, b"q"))
    conn.send_message(1, b"one")
    conn.send_message(1, b"two")
    conn.send_trailers(1, 0)
    frames = peer.frames(conn)
    assert [fr.kind for fr in frames] == [f.HEADERS, f.DATA, f.DATA, f.HEADERS]
    assert peer.headers(frames[0]) == {":status": "200", "content-type": "application/grpc"}
    assert [fr.payload for fr in frames[1:3]] == [encode_message(b"one"), encode_message(b"two")]
    assert frames[3].flags & f.FLAG_END_STREAM and peer.headers(frames[3]) == {"grpc-status": "0"}
    assert conn.active == 0


def test_an_error_before_any_message_is_a_trailers_only_response_with_an_encoded_message() -> None:
    conn, peer = started()
    conn.receive_data(call(1, b"q"))
    conn.send_trailers(1, 3, "max_tokens must be ≥ 1\n100%")
    (fr,) = peer.frames(conn)
    assert fr.kind == f.HEADERS and fr.flags & f.FLAG_END_STREAM
    headers = peer.headers(fr)
    assert headers["grpc-status"] == "3" and headers[":status"] == "200"
    assert headers["grpc-message"] == "max_tokens must be %E2%89%A5 1%0A100%25"


def test_data_beyond_the_peer_window_waits_for_its_window_update() -> None:
    conn, peer = started({f.SETTINGS_INITIAL_WINDOW_SIZE: 10})
    conn.receive_data(call(1, b"q"))
    assert conn.send_message(1, b"abc") == 0  # 8 bytes framed: fits
    waiting = conn.send_message(1, b"defgh")  # 10 bytes framed, 2 bytes of window left
    assert waiting == 8
    conn.send_trailers(1, 0)
    frames = peer.frames(conn)
    assert [fr.kind for fr in frames] == [f.HEADERS, f.DATA, f.DATA]  # no trailers while data waits
    assert len(frames[2].payload) == 2
    events = conn.receive_data(f.window_update_frame(1, 100))
    assert events == [WindowOpened(1)]
    frames = peer.frames(conn)
    assert [fr.kind for fr in frames] == [f.DATA, f.HEADERS]
    assert frames[0].payload == encode_message(b"defgh")[2:]
    assert frames[1].flags & f.FLAG_END_STREAM


def test_the_connection_window_paces_every_stream() -> None:
    conn, peer = started({f.SETTINGS_INITIAL_WINDOW_SIZE: 1 << 20})
    conn.receive_data(call(1, b"q") + call(3, b"q"))
    peer.frames(conn)
    big = b"x" * 40_000
    assert conn.send_message(1, big) == 0
    assert conn.send_message(3, big) == 80_010 - 65_535  # the connection's 65,535 bytes are spent
    assert sum(len(fr.payload) for fr in peer.frames(conn) if fr.kind == f.DATA) == 65_535
    assert conn.receive_data(f.window_update_frame(0, 100_000)) == [WindowOpened(3)]
    assert sum(len(fr.payload) for fr in peer.frames(conn) if fr.kind == f.DATA) == 80_010 - 65_535
    assert conn.stream(3) is not None and conn.stream(3).pending_bytes == 0  # type: ignore[union-attr]


def test_a_message_larger_than_the_peer_frame_size_is_cut_into_frames() -> None:
    conn, peer = started({f.SETTINGS_INITIAL_WINDOW_SIZE: 1 << 20})
    conn.receive_data(call(1, b"q") + f.window_update_frame(0, 1 << 20))
    peer.frames(conn)
    assert conn.send_message(1, b"y" * 40_000) == 0
    data = [fr for fr in peer.frames(conn) if fr.kind == f.DATA]
    assert [len(fr.payload) for fr in data] == [16_384, 16_384, 40_005 - 2 * 16_384]
    assert b"".join(fr.payload for fr in data) == encode_message(b"y" * 40_000)


def test_streams_beyond_the_limit_are_refused() -> None:
    conn, peer = started(max_concurrent_streams=2)
    events = conn.receive_data(call(1, b"a") + call(3, b"b") + call(5, b"c"))
    assert events == [CallReady(1, PATH, b"a"), CallReady(3, PATH, b"b")]
    (rst,) = [fr for fr in peer.frames(conn) if fr.kind == f.RST_STREAM]
    assert rst.stream_id == 5 and f.parse_u32(rst.payload, "") == f.REFUSED_STREAM
    conn.send_trailers(1, 0)  # one ends: a new stream fits again
    assert conn.receive_data(call(7, b"d")) == [CallReady(7, PATH, b"d")]


def test_an_oversized_request_message_fails_that_call_only() -> None:
    conn, _ = started(max_message_bytes=100)
    events = conn.receive_data(call(1, b"z" * 101) + call(3, b"ok"))
    first = events[0]
    assert isinstance(first, CallError) and first.stream_id == 1 and first.code == 8 and "101" in first.details
    assert events[1] == CallReady(3, PATH, b"ok")
    assert conn.failed is None


def test_a_call_without_exactly_one_message_is_an_error() -> None:
    conn, _ = started()
    headers_only = f.frame(f.HEADERS, f.FLAG_END_HEADERS | f.FLAG_END_STREAM, 1, request_headers())
    two = f.frame(f.HEADERS, f.FLAG_END_HEADERS, 3, request_headers()) + f.frame(
        f.DATA, f.FLAG_END_STREAM, 3, encode_message(b"a") + encode_message(b"b")
    )
    events = conn.receive_data(headers_only + two)
    assert [type(e) for e in events] == [CallError, CallError]
    assert [e.code for e in events] == [12, 12]  # type: ignore[union-attr]


def test_a_huge_header_block_closes_the_connection() -> None:
    conn, peer = started(max_header_bytes=1000)
    block = request_headers() + bytes(hpack.Encoder().encode([("x-pad", "p" * 2000)]))
    assert conn.receive_data(f.frame(f.HEADERS, f.FLAG_END_HEADERS, 1, block)) == []
    assert conn.failed is not None
    (goaway,) = peer.frames(conn)
    assert goaway.kind == f.GOAWAY and f.parse_goaway(goaway.payload)[1] == f.ENHANCE_YOUR_CALM


def test_a_header_block_in_continuation_frames_is_joined() -> None:
    conn, _ = started()
    block = request_headers()
    wire = f.frame(f.HEADERS, 0, 1, block[:5]) + f.frame(f.CONTINUATION, 0, 1, block[5:9])
    wire += f.frame(f.CONTINUATION, f.FLAG_END_HEADERS, 1, block[9:])
    wire += f.frame(f.DATA, f.FLAG_END_STREAM, 1, encode_message(b"m"))
    assert conn.receive_data(wire) == [CallReady(1, PATH, b"m")]


def test_header_blocks_with_a_dynamic_table_decode_call_after_call() -> None:
    conn, _ = started()
    encoder = hpack.Encoder()  # one encoder for the connection, as a client keeps it
    wire = b""
    for sid, path in ((1, PATH), (3, "/x/Y"), (5, PATH)):
        wire += f.frame(f.HEADERS, f.FLAG_END_HEADERS, sid, request_headers(path, encoder))
        wire += f.frame(f.DATA, f.FLAG_END_STREAM, sid, encode_message(b""))
    assert [e.path for e in conn.receive_data(wire)] == [PATH, "/x/Y", PATH]  # type: ignore[union-attr]


def test_a_reset_from_the_client_ends_the_call_and_nothing_more_goes_out() -> None:
    conn, peer = started()
    conn.receive_data(call(1, b"q"))
    peer.frames(conn)
    assert conn.receive_data(f.rst_stream_frame(1, f.CANCEL)) == [CallReset(1)]
    assert conn.send_message(1, b"late") == 0
    conn.send_trailers(1, 0)
    assert peer.frames(conn) == []


def test_ping_is_acknowledged_with_its_payload() -> None:
    conn, peer = started()
    conn.receive_data(f.frame(f.PING, 0, 0, b"12345678"))
    (ack,) = peer.frames(conn)
    assert ack.kind == f.PING and ack.flags & f.FLAG_ACK and ack.payload == b"12345678"


def test_received_data_is_acknowledged_so_a_client_is_never_stalled() -> None:
    conn, peer = started()
    big = b"b" * (LOCAL_WINDOW // 2)
    conn.receive_data(call(1, big))
    updates = {fr.stream_id: f.parse_u32(fr.payload, "") for fr in peer.frames(conn) if fr.kind == f.WINDOW_UPDATE}
    assert updates[0] >= LOCAL_WINDOW // 2 and updates[1] >= LOCAL_WINDOW // 2


def test_a_bad_preface_or_broken_framing_sends_goaway() -> None:
    conn = ServerConnection(max_message_bytes=100)
    conn.receive_data(b"GET / HTTP/1.1\r\n\r\n")
    assert conn.failed is not None and f.GOAWAY in [fr.kind for fr in f.FrameReader().feed(conn.data_to_send())]
    conn, peer = started()
    conn.receive_data(f.frame(f.DATA, 0, 0, b"x"))  # DATA on stream 0
    assert conn.failed is not None and [fr.kind for fr in peer.frames(conn)] == [f.GOAWAY]
    assert conn.receive_data(call(1, b"q")) == []  # nothing more is read


def test_after_go_away_new_calls_are_refused_and_open_ones_finish() -> None:
    conn, peer = started()
    conn.receive_data(call(1, b"q"))
    conn.go_away()
    assert conn.receive_data(call(3, b"q")) == []
    conn.send_message(1, b"r")
    conn.send_trailers(1, 0)
    kinds = [(fr.kind, fr.stream_id) for fr in peer.frames(conn)]
    assert (f.GOAWAY, 0) in kinds and (f.RST_STREAM, 3) in kinds and (f.HEADERS, 1) in kinds


def test_a_calls_metadata_is_its_own_headers_only() -> None:
    conn, _ = started()
    block = request_headers() + bytes(hpack.Encoder().encode([("traceparent", "00-ab-cd-01"), ("x-k", "v")]))
    wire = f.frame(f.HEADERS, f.FLAG_END_HEADERS, 1, block)
    wire += f.frame(f.DATA, f.FLAG_END_STREAM, 1, encode_message(b"m"))
    (ready,) = conn.receive_data(wire)
    assert isinstance(ready, CallReady)
    assert ready.metadata == (("traceparent", "00-ab-cd-01"), ("x-k", "v"))
