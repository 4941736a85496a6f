"""The receive hot path in C (`node/workers/_rx.c`): what it returns is what the Python code returns without it.

`frames` cuts the worker's bytes into HTTP/2 frames (a streamed token's DATA frame as its one gRPC message);
`chunks` decodes Generate's plain streamed chunks. Each is checked against the pure-Python path on random
wire bytes, cut anywhere, including every case the C code must decline (padding, flags, compression, a
message across frames, logprobs, unknown fields, oversized or malformed varints).
"""

from __future__ import annotations

import pytest
from google.protobuf.message import DecodeError  # type: ignore[import-untyped,unused-ignore]  # stubs optional
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from smg_grpc_proto.generated import vllm_engine_pb2 as pb

from node.errors import WorkerFailed
from node.workers import _rx, h2_frames, vllm_grpc
from node.workers import h2_frames as f
from node.workers.grpc_wire import encode_message
from node.workers.types import WorkerOutput

MAX_MESSAGE = 64


def test_the_extension_is_built_and_used() -> None:
    # An install without a C compiler takes the Python loops (compared with the C code below).
    assert vars(h2_frames)["_c_frames"] is _rx.frames and vars(vllm_grpc)["_plain_chunks"] is _rx.chunks


# --- frames ------------------------------------------------------------------------------------------------


_payloads = st.one_of(
    st.binary(max_size=80).map(encode_message),  # one whole message (the hot case, or above MAX_MESSAGE)
    st.binary(max_size=40).map(lambda m: encode_message(m)[: len(m) // 2 + 3]),  # a message cut short
    st.lists(st.binary(max_size=20), min_size=2, max_size=3).map(lambda ms: b"".join(map(encode_message, ms))),
    st.binary(max_size=30).map(lambda m: b"\x01" + encode_message(m)[1:]),  # compressed flag
    st.binary(max_size=12),  # anything
)
_frame_list = st.lists(
    st.tuples(
        st.sampled_from([f.DATA, f.DATA, f.DATA, f.HEADERS, f.RST_STREAM, f.PING, f.WINDOW_UPDATE, 0x42]),
        st.sampled_from([0, 0, 0, f.FLAG_END_STREAM, f.FLAG_PADDED, 0x80]),
        st.integers(min_value=0, max_value=2**31 - 1) | st.sampled_from([1, 3, 5]),
        _payloads,
    ),
    max_size=12,
)


def _wire(frames: list[tuple[int, int, int, bytes]]) -> bytes:
    out = b""
    for kind, flags, sid, payload in frames:
        out += f.frame(kind, flags, sid, payload)
    return out


def _feed_all(reader: f.FrameReader, wire: bytes, cuts: list[int]) -> list[object]:
    got: list[object] = []
    pos = 0
    for cut in [*cuts, len(wire)]:
        got.extend(reader.feed_messages(wire[pos : pos + cut], MAX_MESSAGE))
        pos += cut
    return got


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(frames=_frame_list, cuts=st.lists(st.integers(min_value=1, max_value=50), max_size=20))
@example(frames=[(f.DATA, 0, 1, encode_message(b"x" * MAX_MESSAGE))], cuts=[])  # the largest hot message
@example(frames=[(f.DATA, 0, 1, encode_message(b"x" * (MAX_MESSAGE + 1)))], cuts=[])  # one byte too many
def test_frames_match_the_python_loop_whatever_the_cuts(
    frames: list[tuple[int, int, int, bytes]], cuts: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    wire = _wire(frames)
    with_c = _feed_all(f.FrameReader(max_frame_size=200), wire, cuts)
    with monkeypatch.context() as m:  # undone per example (a fixture is not)
        m.setattr(h2_frames, "_c_frames", None)
        without = _feed_all(f.FrameReader(max_frame_size=200), wire, cuts)
    assert with_c == without
    assert [type(item) for item in with_c] == [type(item) for item in without]
    # And both are the frames as sent: a hot item is a DATA frame without flags and its one message.
    assert len(with_c) == len(frames)
    for item, (kind, flags, sid, payload) in zip(with_c, frames, strict=True):
        if type(item) is tuple:
            assert (kind, flags) == (f.DATA, 0) and item == (sid & 0x7FFFFFFF, payload[5:])
            assert len(payload) - 5 <= MAX_MESSAGE and payload[:1] == b"\0"
        else:
            assert item == f.Frame(kind, flags, sid & 0x7FFFFFFF, payload)


def test_feed_returns_a_streamed_tokens_data_frame_as_the_frame_it_is() -> None:
    wire = f.frame(f.DATA, 0, 3, encode_message(b"tok"))
    assert f.FrameReader().feed(wire) == [f.Frame(f.DATA, 0, 3, encode_message(b"tok"))]
    assert type(f.FrameReader().feed(wire)[0]) is f.Frame


def test_a_frame_above_the_limit_raises_as_before() -> None:
    reader = f.FrameReader(max_frame_size=100)
    wire = f.frame(f.DATA, 0, 1, encode_message(b"a")) + f.frame(f.DATA, 0, 1, b"x" * 101)
    with pytest.raises(f.FrameError):
        reader.feed_messages(wire, MAX_MESSAGE)


# --- chunks ------------------------------------------------------------------------------------------------

_u32 = st.integers(min_value=0, max_value=2**32 - 1)


@st.composite
def _message(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["chunk", "chunk", "chunk", "logprobs", "complete", "raw", "crafted"]))
    if kind == "raw":
        return draw(st.binary(max_size=20))
    if kind == "crafted":  # valid protobuf in shapes protobuf itself never writes, or wire protobuf keeps aside
        parts = draw(
            st.lists(
                st.sampled_from(
                    [
                        b"\x08\x05",  # an unpacked id
                        b"\x0a\x02\x81\x01",  # a packed id (129)
                        b"\x10\x07",  # prompt_tokens
                        b"\x38\x01",  # index 1
                        b"\x38\x00",
                        b"\x20\xff\xff\xff\xff\x0f",  # cached_tokens 2**32 - 1
                        b"\x18\x80\x80\x80\x80\x10",  # a count above 32 bits
                        b"\x50\x01",  # field 10: unknown
                        b"\x12\x00",  # prompt_tokens with the wrong wire type
                        b"\x0a\x03\x01\x02",  # a packed run longer than its bytes
                        b"\x0a\x05\x80\x80\x80\x80\x10",  # a packed id above 32 bits
                    ]
                ),
                max_size=6,
            )
        )
        body = b"".join(parts)
        outer = b"\x0a" + bytes((len(body),)) + body
        # a second member: an empty chunk, a chunk to merge, the other member of the oneof
        return outer + draw(st.sampled_from([b"", b"", b"\x0a\x00", b"\x0a\x02\x10\x09", b"\x12\x02\x08\x01"]))
    if kind == "complete":
        resp = pb.GenerateResponse()
        resp.complete.output_ids.extend(draw(st.lists(_u32, max_size=3)))
        resp.complete.finish_reason = draw(st.sampled_from(["stop", "length", ""]))
        return bytes(resp.SerializeToString())
    resp = pb.GenerateResponse()
    c = resp.chunk
    c.token_ids.extend(draw(st.lists(_u32, max_size=4)))
    c.prompt_tokens = draw(_u32)
    c.completion_tokens = draw(_u32)
    c.cached_tokens = draw(_u32)
    c.index = draw(st.sampled_from([0, 0, 0, 1, 2**32 - 1]))
    if kind == "logprobs":
        c.output_logprobs.token_logprobs.append(-0.5)
        c.output_logprobs.token_ids.append(7)
    return bytes(resp.SerializeToString())


def _python_outputs(batch: list[bytes], merge: bool, monkeypatch: pytest.MonkeyPatch) -> object:
    with monkeypatch.context() as m:
        m.setattr(vllm_grpc, "_plain_chunks", None)
        return _outcome(batch, merge)


def _outcome(batch: list[bytes], merge: bool) -> object:
    try:
        outs = vllm_grpc._outputs(batch, pb.GenerateResponse.FromString, merge)
    except (DecodeError, WorkerFailed) as exc:
        return type(exc)
    return [(*o[:1], list(o.token_ids), *o[2:5], o.finish_reason, o.matched_token_id) for o in outs]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.lists(_message(), max_size=7), merge=st.booleans())
def test_outputs_match_protobufs_whatever_the_messages(
    batch: list[bytes], merge: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _outcome(batch, merge) == _python_outputs(batch, merge, monkeypatch)


def _chunk(ids: list[int], completion: int, cached: int = 0, index: int = 0) -> bytes:
    resp = pb.GenerateResponse()
    resp.chunk.token_ids.extend(ids)
    resp.chunk.prompt_tokens = 200
    resp.chunk.completion_tokens = completion
    resp.chunk.cached_tokens = cached
    resp.chunk.index = index
    return bytes(resp.SerializeToString())


def test_plain_chunks_are_decoded_in_c_and_merged_as_protobuf_would() -> None:
    batch = [_chunk([11], 1, cached=150), _chunk([12, 13], 3, cached=160), _chunk([14], 4), _chunk([15], 5)]
    outs = _rx.chunks(batch, WorkerOutput, True)
    assert outs is not None and all(type(o) is WorkerOutput for o in outs)
    assert outs == [WorkerOutput(0, [11, 12, 13, 14], 200, 4, 160), WorkerOutput(0, [15], 200, 5, 0)]
    assert _rx.chunks(batch, WorkerOutput, False) == [
        WorkerOutput(0, [11], 200, 1, 150),
        WorkerOutput(0, [12, 13], 200, 3, 160),
        WorkerOutput(0, [14], 200, 4, 0),
        WorkerOutput(0, [15], 200, 5, 0),
    ]
    # A message protobuf must read (the final one, with its finish reason): the C code declines the batch.
    final = pb.GenerateResponse()
    final.complete.finish_reason = "stop"
    assert _rx.chunks([*batch, final.SerializeToString()], WorkerOutput, True) is None
