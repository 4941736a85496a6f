"""The sans-IO HTTP/2 + gRPC core, without sockets or a loop: a scripted peer feeds it bytes."""

from __future__ import annotations

from collections.abc import Iterable

import hpack
from hypothesis import example, given
from hypothesis import strategies as st

from node.workers import h2_frames as f
from node.workers.grpc_wire import (
    CANCELLED,
    INTERNAL,
    UNAVAILABLE,
    UNKNOWN,
    GrpcStatus,
    MessageReader,
    encode_message,
    status_of,
)
from node.workers.h2_connection import MAX_HEADER_BLOCK_BYTES, H2Connection, Stream

BLOCK = hpack.Encoder().encode([hpack.NeverIndexedHeaderTuple(":method", "POST")])


def _ready(settings: dict[int, int] | None = None) -> H2Connection:
    conn = H2Connection(max_message_bytes=1 << 20)
    conn.initiate()
    assert conn.data_to_send().startswith(f.PREFACE)
    conn.receive_data(f.settings_frame(settings or {}))
    assert conn.ready
    assert _frames(conn.data_to_send()) == [f.Frame(f.SETTINGS, f.FLAG_ACK, 0, b"")]
    return conn


def _frames(data: bytes) -> list[f.Frame]:
    return f.FrameReader(1 << 24).feed(data)


def _headers(stream_id: int, fields: list[tuple[str, str]], *, end: bool, encoder: hpack.Encoder) -> bytes:
    flags = f.FLAG_END_HEADERS | (f.FLAG_END_STREAM if end else 0)
    return f.frame(f.HEADERS, flags, stream_id, encoder.encode(fields))


def _response(stream_id: int, messages: list[bytes], encoder: hpack.Encoder, status: int = 0) -> bytes:
    out = _headers(stream_id, [(":status", "200"), ("content-type", "application/grpc")], end=False, encoder=encoder)
    out += f.frame(f.DATA, 0, stream_id, b"".join(encode_message(m) for m in messages))
    trailers = [("grpc-status", str(status)), ("grpc-message", "bad%20prompt")]
    return out + _headers(stream_id, trailers, end=True, encoder=encoder)


@given(
    messages=st.lists(st.binary(max_size=300), min_size=1, max_size=8),
    cuts=st.lists(st.integers(min_value=1, max_value=64), max_size=40),
    layout=st.sampled_from(["padded", "split", "whole", "packed"]),
)
def test_messages_and_status_are_the_same_whatever_the_chunk_boundaries(
    messages: list[bytes], cuts: list[int], layout: str
) -> None:
    conn = _ready()
    stream = conn.open_stream(BLOCK, encode_message(b"req"))
    encoder = hpack.Encoder()
    wire = _headers(1, [(":status", "200")], end=False, encoder=encoder)
    if layout == "packed":  # several messages in one DATA frame
        wire += f.frame(f.DATA, 0, 1, b"".join(encode_message(m) for m in messages))
    for m in messages if layout != "packed" else ():
        payload = encode_message(m)
        if layout == "padded":  # one message per frame, padded
            wire += f.frame(f.DATA, f.FLAG_PADDED, 1, bytes((3,)) + payload + b"\0\0\0")
        elif layout == "whole":  # one message per frame: a streamed token's case
            wire += f.frame(f.DATA, 0, 1, payload)
        else:  # a message across two frames
            half = len(payload) // 2
            wire += f.frame(f.DATA, 0, 1, payload[:half]) + f.frame(f.DATA, 0, 1, payload[half:])
    wire += _headers(1, [("grpc-status", "0")], end=True, encoder=encoder)
    got: list[bytes] = []
    pos = 0
    for cut in [*cuts, len(wire)]:
        conn.receive_data(wire[pos : pos + cut])
        pos += cut
        got += stream.messages
        stream.messages = []
        if pos >= len(wire):
            break
    assert got == messages
    assert stream.ended
    assert stream.status is not None
    assert stream.status.code == 0


@given(data=st.binary(max_size=2000), cuts=st.lists(st.integers(min_value=0, max_value=300), max_size=20))
def test_frame_reader_is_chunk_boundary_invariant(data: bytes, cuts: list[int]) -> None:
    frames = [f.frame(f.DATA, i % 2, i, data[i * 7 : i * 7 + 50]) for i in range(1, 10)]
    wire = b"".join(frames)
    whole = f.FrameReader().feed(wire)
    reader = f.FrameReader()
    pieces: list[f.Frame] = []
    pos = 0
    for cut in cuts:
        pieces += reader.feed(wire[pos : pos + cut])
        pos += cut
    pieces += reader.feed(wire[pos:])
    assert pieces == whole
    assert len(whole) == 9


def test_message_reader_rejects_compressed_and_oversized_messages() -> None:
    reader = MessageReader(10)
    out: list[bytes] = []
    reader.feed(encode_message(b"0123456789"), out)
    assert out == [b"0123456789"]
    for bad in (b"\x01" + encode_message(b"x")[1:], encode_message(b"x" * 11)):
        try:
            MessageReader(10).feed(bad, [])
        except Exception as exc:
            assert "compressed" in str(exc) or "bound" in str(exc)
        else:
            raise AssertionError("accepted")


def test_a_non_ok_status_and_its_percent_encoded_message() -> None:
    conn = _ready()
    stream = conn.open_stream(BLOCK, encode_message(b"req"))
    changed = conn.receive_data(_response(1, [b"a"], hpack.Encoder(), status=3))
    assert changed == [stream]
    assert stream.messages == [b"a"]
    assert stream.status is not None
    assert (stream.status.name, stream.status.message) == ("INVALID_ARGUMENT", "bad prompt")


def test_trailers_only_and_http_errors() -> None:
    assert status_of([(":status", "200"), ("grpc-status", "14")], http_status=None).code == UNAVAILABLE  # type: ignore[union-attr]
    assert status_of([(":status", "503")], http_status=None).code == UNAVAILABLE  # type: ignore[union-attr]
    assert status_of([(":status", "404")], http_status=None).name == "UNIMPLEMENTED"  # type: ignore[union-attr]
    conn = _ready()
    stream = conn.open_stream(BLOCK, encode_message(b"req"))
    conn.receive_data(_headers(1, [(":status", "200"), ("grpc-status", "12")], end=True, encoder=hpack.Encoder()))
    assert stream.ended
    assert stream.status is not None
    assert stream.status.name == "UNIMPLEMENTED"


def test_a_large_request_waits_for_window_updates_and_respects_the_frame_size() -> None:
    conn = _ready({f.SETTINGS_INITIAL_WINDOW_SIZE: 1000, f.SETTINGS_MAX_FRAME_SIZE: 16_384})
    body = encode_message(bytes(200_000))
    conn.open_stream(BLOCK, body)
    sent = [fr for fr in _frames(conn.data_to_send()) if fr.kind == f.DATA]
    assert sum(len(fr.payload) for fr in sent) == 1000  # the stream window, below the connection's 65,535
    conn.receive_data(f.window_update_frame(1, 500_000))
    sent = [fr for fr in _frames(conn.data_to_send()) if fr.kind == f.DATA]
    assert sum(len(fr.payload) for fr in sent) == 65_535 - 1000  # now the connection window limits
    assert all(len(fr.payload) <= 16_384 for fr in sent)
    conn.receive_data(f.window_update_frame(0, 1_000_000))
    sent += [fr for fr in _frames(conn.data_to_send()) if fr.kind == f.DATA]
    assert sum(len(fr.payload) for fr in sent) + 1000 == len(body)
    assert sent[-1].flags & f.FLAG_END_STREAM
    assert not any(fr.flags & f.FLAG_END_STREAM for fr in sent[:-1])


def test_received_data_is_acknowledged_before_the_window_runs_low() -> None:
    conn = _ready()
    conn.open_stream(BLOCK, encode_message(b"req"))
    conn.data_to_send()
    encoder = hpack.Encoder()
    conn.receive_data(_headers(1, [(":status", "200")], end=False, encoder=encoder))
    frame = f.frame(f.DATA, 0, 1, encode_message(bytes((1 << 19) - 5)))
    for _ in range(1 << 10):  # 512 MiB through one stream
        conn.receive_data(frame)
    updates = [fr for fr in _frames(conn.data_to_send()) if fr.kind == f.WINDOW_UPDATE]
    assert {fr.stream_id for fr in updates} == {0, 1}


def test_stream_limit_cancel_ping_and_goaway() -> None:
    conn = _ready({f.SETTINGS_MAX_CONCURRENT_STREAMS: 2})
    a = conn.open_stream(BLOCK, encode_message(b"a"))
    b = conn.open_stream(BLOCK, encode_message(b"b"))
    assert not conn.can_open()
    conn.data_to_send()
    conn.cancel_stream(a)
    assert _frames(conn.data_to_send()) == [f.Frame(f.RST_STREAM, 0, 1, (f.CANCEL).to_bytes(4, "big"))]
    assert a.status is not None
    assert a.status.code == CANCELLED
    assert conn.can_open()
    c = conn.open_stream(BLOCK, encode_message(b"c"))
    conn.data_to_send()
    conn.receive_data(f.frame(f.PING, 0, 0, b"12345678"))
    assert _frames(conn.data_to_send()) == [f.Frame(f.PING, f.FLAG_ACK, 0, b"12345678")]
    changed = conn.receive_data(f.goaway_frame(3, f.NO_ERROR))
    assert changed == [c]  # stream 5 was never processed; 3 may still finish
    assert c.unprocessed
    assert c.status is not None
    assert c.status.code == UNAVAILABLE
    assert not b.ended
    assert not conn.accepting
    lost = conn.connection_lost("gone")
    assert lost == [b]
    assert b.status is not None
    assert b.status.code == UNAVAILABLE


def test_refused_stream_is_unprocessed_and_protocol_errors_fail_every_stream() -> None:
    conn = _ready()
    a = conn.open_stream(BLOCK, encode_message(b"a"))
    b = conn.open_stream(BLOCK, encode_message(b"b"))
    conn.receive_data(f.rst_stream_frame(1, f.REFUSED_STREAM))
    assert a.unprocessed
    changed = conn.receive_data(f.frame(f.PUSH_PROMISE, 0, 3, bytes(4)))
    assert changed == [b]
    assert b.status is not None
    assert b.status.code == INTERNAL
    assert any(fr.kind == f.GOAWAY for fr in _frames(conn.data_to_send()))
    assert conn.closed is not None


def test_stream_objects_are_independent() -> None:
    s = Stream(1, b"", 10, 10)
    assert s.messages == []
    assert not s.ended


# --- HPACK: SETTINGS_HEADER_TABLE_SIZE 0 and the header-block cache ---

_RESPONSE_HEADERS = [(":status", "200"), ("content-type", "application/grpc")]
_TRAILERS = [("grpc-status", "3"), ("grpc-message", "bad%20prompt")]


class _CountingDecoder(hpack.Decoder):
    """The library's decoder, counting the blocks it is really asked to decode."""

    calls = 0

    def decode(self, data: bytes, raw: bool = False) -> Iterable[hpack.HeaderTuple]:
        self.calls += 1
        return super().decode(data, raw)


def _call(conn: H2Connection, headers: bytes, trailers: bytes, message: bytes) -> Stream:
    """One call whose response is the given header blocks around ``message``; checks what the stream got."""
    stream = conn.open_stream(BLOCK, encode_message(b"req"))
    wire = f.frame(f.HEADERS, f.FLAG_END_HEADERS, stream.id, headers)
    wire += f.frame(f.DATA, 0, stream.id, encode_message(message))
    wire += f.frame(f.HEADERS, f.FLAG_END_HEADERS | f.FLAG_END_STREAM, stream.id, trailers)
    assert conn.receive_data(wire) == [stream]
    assert stream.messages == [message]
    assert stream.http_status == 200
    assert stream.status == GrpcStatus(3, "bad prompt")
    return stream


def test_initiate_advertises_no_hpack_dynamic_table() -> None:
    conn = H2Connection(max_message_bytes=1 << 20)
    conn.initiate()
    data = conn.data_to_send()
    assert data.startswith(f.PREFACE)
    settings = _frames(data[len(f.PREFACE) :])[0]
    assert settings.kind == f.SETTINGS
    assert not settings.flags & f.FLAG_ACK
    assert dict(f.parse_settings(settings.payload))[f.SETTINGS_HEADER_TABLE_SIZE] == 0


def test_repeated_blocks_of_a_peer_without_dynamic_table_come_from_the_cache() -> None:
    conn = _ready()
    decoder = conn._decoder = _CountingDecoder()
    encoder = hpack.Encoder()
    encoder.header_table_size = 0  # what a peer does once it read our SETTINGS_HEADER_TABLE_SIZE 0
    blocks = []
    for i in range(10):
        headers, trailers = encoder.encode(_RESPONSE_HEADERS), encoder.encode(_TRAILERS)
        blocks += [headers, trailers]
        _call(conn, headers, trailers, b"m%d" % i)
    assert blocks[0][:1] == b"\x20"  # the size update, decoded from the initial 4096-byte table: not cached
    assert len(set(blocks[2:])) == 2  # then the same two blocks, again and again
    # Decoded: the first call's two blocks and the second call's headers (the first without the update).
    assert decoder.calls == 3
    assert conn.header_cache_hits == 17
    assert decoder.header_table_size == 0
    assert not decoder.header_table.dynamic_entries


def test_repeated_blocks_of_a_peer_that_never_indexes_come_from_the_cache() -> None:
    """A peer that sends no size update but never indexes a field (our simulated worker's server): the table
    stays empty at its initial 4096 bytes, so each distinct block is decoded once."""
    conn = _ready()
    decoder = conn._decoder = _CountingDecoder()
    encoder = hpack.Encoder()
    for i in range(10):
        headers = encoder.encode([hpack.NeverIndexedHeaderTuple(k, v) for k, v in _RESPONSE_HEADERS])
        trailers = encoder.encode([hpack.NeverIndexedHeaderTuple(k, v) for k, v in _TRAILERS])
        stream = _call(conn, headers, trailers, b"m%d" % i)
        assert stream.status is not None and stream.status.code == 3 and stream.status.message == "bad prompt"
    assert decoder.calls == 2
    assert conn.header_cache_hits == 18
    assert decoder.header_table_size == 4096 and not decoder.header_table.dynamic_entries


def test_a_peer_that_keeps_its_dynamic_table_is_decoded_every_time_and_never_cached() -> None:
    conn = _ready()
    decoder = conn._decoder = _CountingDecoder()
    encoder = hpack.Encoder()  # ignores our setting: a 4096-byte table, fields indexed once seen
    blocks = []
    for i in range(10):
        headers, trailers = encoder.encode(_RESPONSE_HEADERS), encoder.encode(_TRAILERS)
        blocks += [headers, trailers]
        _call(conn, headers, trailers, b"m%d" % i)
    assert len(blocks[2]) < len(blocks[0])  # the second call's blocks are references into the dynamic table
    assert decoder.calls == 20
    assert conn.header_cache_hits == 0
    assert not conn._header_cache


def test_a_peer_that_raises_its_table_size_again_is_decoded_with_its_table() -> None:
    """A cached block's bytes may come again while the peer has a table (an unindexed field is the same literal
    at any table size): it then inserts entries and must be decoded. And a block that raised the size from the
    cacheable state must not be cached: replaying it would skip the raise. Two cycles reach both cases; the
    decoder's table must follow a reference decoder's throughout."""
    conn = _ready()
    decoder = conn._decoder = _CountingDecoder()
    ref = hpack.Decoder()
    encoder = hpack.Encoder()
    cached: set[bytes] = set()
    same_bytes_with_a_table = 0
    for i, size in enumerate([0, 0, 0, 4096, 4096, 4096, 0, 0, 0, 4096, 4096, 4096, 0, 0, 0]):
        encoder.header_table_size = size
        headers, trailers = encoder.encode(_RESPONSE_HEADERS), encoder.encode(_TRAILERS)
        hits, calls = conn.header_cache_hits, decoder.calls
        for block in (headers, trailers):
            if ref.header_table_size and block in cached:
                same_bytes_with_a_table += 1
            elif not ref.header_table_size:
                cached.add(block)
            ref.decode(block)
        _call(conn, headers, trailers, b"m%d" % i)
        assert decoder.header_table_size == ref.header_table_size == size
        assert decoder.header_table.dynamic_entries == ref.header_table.dynamic_entries
        if size:
            assert conn.header_cache_hits == hits  # a table: nothing from the cache
            assert decoder.calls == calls + 2
    assert same_bytes_with_a_table >= 2  # the case the cache must refuse did happen (once per cycle)
    assert conn.header_cache_hits >= 8


def test_a_non_numeric_status_is_an_http_error_not_a_crash() -> None:
    conn = _ready()
    stream = conn.open_stream(BLOCK, encode_message(b"req"))
    conn.receive_data(_headers(1, [(":status", "²")], end=True, encoder=hpack.Encoder()))  # isdigit() is True
    assert stream.http_status == 0
    assert stream.status is not None
    assert stream.status.code == UNKNOWN


_FIELD = st.sampled_from(
    [
        (":status", "200"),
        (":status", "503"),
        ("content-type", "application/grpc"),
        ("grpc-status", "0"),
        ("grpc-status", "3"),
        ("grpc-message", "bad%20prompt"),
        ("x-trace", "abc"),
        ("x-long", "v" * 90),  # larger than a 64-byte table: inserting it empties the table
    ]
)


@given(
    # A few header lists the peer sends again and again (identical blocks are what the cache is about) ...
    lists=st.lists(st.lists(_FIELD, min_size=1, max_size=4), min_size=1, max_size=3),
    steps=st.lists(
        st.tuples(
            # ... each step: the table size changes before the block (none half the time), which list, and
            # whether its fields are never-indexed.
            st.one_of(st.just([]), st.lists(st.sampled_from([0, 0, 64, 256, 4096]), min_size=1, max_size=3)),
            st.integers(min_value=0, max_value=2),
            st.booleans(),
        ),
        min_size=1,
        max_size=40,
    ),
)
# A cached block's bytes again once the peer has a table (they insert an entry then); a block that raised the size
# from the cacheable state, sent again from that state (it must not have been cached).
@example(
    lists=[[("x-trace", "abc")], [("grpc-status", "0")]],
    steps=[([0], 0, False), ([], 0, False), ([4096], 1, False), ([], 0, False)],
)
@example(lists=[[("x-trace", "abc")]], steps=[([0], 0, False), ([4096], 0, False), ([0], 0, False), ([4096], 0, False)])
def test_decoding_through_the_cache_is_what_a_reference_decoder_gives(
    lists: list[list[tuple[str, str]]], steps: list[tuple[list[int], int, bool]]
) -> None:
    conn = _ready()
    ref = hpack.Decoder()
    encoder = hpack.Encoder()
    for sizes, which, never in steps:
        for size in sizes:
            if size != encoder.header_table_size:  # hpack's Encoder forgets a pending update on a same-size set
                encoder.header_table_size = size
        fields = lists[which % len(lists)]
        block = encoder.encode([hpack.NeverIndexedHeaderTuple(k, v) if never else (k, v) for k, v in fields])
        want = [(str(k), str(v)) for k, v in ref.decode(block)]
        assert want == fields
        stream = conn.open_stream(BLOCK, encode_message(b"req"))  # a trailers-only response per block
        conn.receive_data(f.frame(f.HEADERS, f.FLAG_END_HEADERS | f.FLAG_END_STREAM, stream.id, block))
        http_status = int(dict(want).get(":status", "0"))
        assert stream.http_status == http_status
        status = status_of(want, http_status=http_status) or GrpcStatus(
            INTERNAL, "the worker ended the stream without a grpc-status"
        )
        assert stream.ended
        assert stream.status == status
        assert conn._decoder.header_table_size == ref.header_table_size
        assert conn._decoder.header_table.dynamic_entries == ref.header_table.dynamic_entries


def test_a_header_block_without_end_is_bounded() -> None:
    """A worker that sends CONTINUATION frames without end: the connection fails (GOAWAY ENHANCE_YOUR_CALM, its
    streams UNAVAILABLE/INTERNAL) once the block passes the bound, instead of buffering without end."""
    conn = _ready()
    stream = conn.open_stream(BLOCK, encode_message(b"req"))
    conn.data_to_send()
    piece = b"\x00" * 16_384  # any bytes: the block is never decoded
    conn.receive_data(f.frame(f.HEADERS, 0, 1, piece))
    sent = 16_384
    while conn.closed is None and sent <= MAX_HEADER_BLOCK_BYTES:
        conn.receive_data(f.frame(f.CONTINUATION, 0, 1, piece))
        sent += len(piece)
    assert conn.closed is not None and sent <= MAX_HEADER_BLOCK_BYTES + len(piece)
    assert stream.ended and stream.status is not None and stream.status.code != 0
    goaway = [fr for fr in _frames(conn.data_to_send()) if fr.kind == f.GOAWAY]
    assert len(goaway) == 1 and int.from_bytes(goaway[0].payload[4:8], "big") == f.ENHANCE_YOUR_CALM


def test_a_header_block_in_continuations_under_the_bound_decodes() -> None:
    conn = _ready()
    stream = conn.open_stream(BLOCK, encode_message(b"req"))
    block = hpack.Encoder().encode([(":status", "200"), ("x-big", "v" * 20_000)])
    third = len(block) // 3
    conn.receive_data(
        f.frame(f.HEADERS, 0, 1, block[:third])
        + f.frame(f.CONTINUATION, 0, 1, block[third : 2 * third])
        + f.frame(f.CONTINUATION, f.FLAG_END_HEADERS, 1, block[2 * third :])
    )
    assert conn.closed is None and stream.http_status == 200
