"""Wire format and robustness: round trips, an append-only kind table, garbage only ever counted."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mesh.state import ClusterState
from mesh.state.config import STATE_WIRE_VERSION, StateConfig
from mesh.state.gossip import DeltaQueue
from mesh.state.wire import (
    MAX_STATE_DOCS,
    Delta,
    DocState,
    Generation,
    PeerState,
    StateDecodeError,
    StateKind,
    decode_delta,
    decode_state,
    decode_sv,
    encode_delta,
    encode_state,
    encode_sv,
    sv_min,
)
from mesh.wire_pb import mesh_state_pb2 as pb

names = st.text(min_size=0, max_size=20)
generations = st.builds(Generation, st.integers(0, 2**32 - 1), names, st.integers(0, 2**63))
blobs = st.binary(max_size=64)


def test_kinds_and_version_are_pinned() -> None:
    assert STATE_WIRE_VERSION == 2 == pb.StateWireVersion.Value("STATE_WIRE_VERSION_PROTOBUF")
    assert {k.name: k.value for k in StateKind} == {"DELTA": 1, "STATE": 2}
    assert {f"STATE_KIND_{k.name}": k.value for k in StateKind} == {n: v for n, v in pb.StateKind.items() if v}


def test_a_state_is_bounded_before_protobuf_parses_it() -> None:
    header = bytes([STATE_WIRE_VERSION, StateKind.STATE])
    many = header + b"\x0a\x01a" + b"\x12\x00" * (MAX_STATE_DOCS + 1)  # empty documents, 2 bytes each
    with pytest.raises(StateDecodeError, match=f"more than {MAX_STATE_DOCS}"):
        decode_state(many)
    with pytest.raises(StateDecodeError, match="without"):
        decode_state(header + b"\x0a\x01a" + b"\x12\x00")  # one document with no fields
    # A delta cut at a field boundary lacks its update: refused, not read as empty.
    full = encode_delta(Delta("d", Generation(1, "n"), 7, 0, 1, b"u"))
    with pytest.raises(StateDecodeError, match="without update"):
        decode_delta(full[: full.index(b"u", 4) - 2])


@settings(max_examples=200)
@given(names, generations, st.integers(0, 2**64 - 1), st.integers(0, 2**31), st.integers(0, 2**31), blobs)
def test_delta_round_trip(doc: str, gen: Generation, client: int, a: int, b: int, update: bytes) -> None:
    start, end = min(a, b), max(a, b)
    delta = Delta(doc, gen, client, start, end, update or b"\x00")
    decoded = decode_delta(encode_delta(delta))
    assert decoded == Delta(doc, Generation(gen.number, gen.node), client, start, end, update or b"\x00")


@settings(max_examples=100)
@given(names, st.lists(st.tuples(names, generations, st.booleans(), blobs, blobs, blobs), max_size=5))
def test_state_round_trip(node: str, sections: list[tuple[str, Generation, bool, bytes, bytes, bytes]]) -> None:
    state = PeerState(node, tuple(DocState(*s) for s in sections))
    decoded = decode_state(encode_state(state))
    assert decoded == state
    assert [d.gen.wall_ms for d in decoded.docs] == [s[1].wall_ms for s in sections]


@settings(max_examples=200)
@given(st.dictionaries(st.integers(0, 2**53), st.integers(0, 2**32 - 1), max_size=20))
def test_state_vector_round_trip(sv: dict[int, int]) -> None:
    assert decode_sv(encode_sv(sv)) == sv


def test_sv_min_is_pointwise() -> None:
    assert sv_min([{1: 5, 2: 3}, {1: 2, 3: 9}]) == {1: 2}
    assert sv_min([]) == {}


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_decoders_raise_only_their_error_on_garbage(data: bytes) -> None:
    for decode in (decode_delta, decode_state, decode_sv):
        try:
            decode(data)
        except StateDecodeError:
            pass


def _valid_messages() -> tuple[bytes, bytes]:
    a = ClusterState("a")
    a.set_row("health", {"ok": True})
    a.add("workers", "w", {"url": "x"}, 10.0)
    delta = a.get_broadcasts(5, 1300)[0]
    return delta, a.local_state(True)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_mutated_messages_are_dropped_and_counted_never_raised(data: st.DataObject) -> None:
    delta, state = _valid_messages()
    target = ClusterState("b")
    for msg in (delta, state):
        raw = bytearray(msg)
        # (Positions are drawn independently of the length: client ids are random, so lengths vary.)
        for _ in range(data.draw(st.integers(1, 4))):
            raw[data.draw(st.integers(0, 10_000)) % len(raw)] = data.draw(st.integers(0, 255))
        cut = len(raw) - data.draw(st.integers(0, 10_000)) % (len(raw) + 1)
        target.notify_msg(bytes(raw[:cut]))
        target.merge_remote_state(bytes(raw[:cut]), False)
    target.tick(20.0, ["b"])
    target.local_state(False)


def test_malformed_input_is_counted() -> None:
    state = ClusterState("b")
    state.notify_msg(b"\x09\x01")
    state.merge_remote_state(bytes([STATE_WIRE_VERSION, StateKind.DELTA]) + b"garbage", False)
    assert state.metrics().malformed == 2


def test_delta_queue_sends_fewest_sent_first_and_retires_after_the_limit() -> None:
    queue = DeltaQueue(retransmit_mult=2)  # 2 x ceil(log10(3 + 1)) = 2 transmits in a cluster of 3
    for i in range(3):
        queue.offer_raw(bytes([i]) * 100, "g/t")
    first = queue.get(5, 230, 3, lambda *_: None)
    assert first == [bytes([2]) * 100, bytes([1]) * 100]  # newest first, as many as fit
    second = queue.get(5, 230, 3, lambda *_: None)
    assert second[0] == bytes([0]) * 100  # the one never sent goes before second sends
    for _ in range(3):
        queue.get(5, 1000, 3, lambda *_: None)
    assert len(queue) == 0


def test_oversized_deltas_are_left_to_push_pull() -> None:
    config = StateConfig(max_delta_bytes=200)
    a, b = ClusterState("a", config), ClusterState("b", config)
    a.set_row("health", {"pad": "x" * 300})
    assert a.get_broadcasts(5, 1300) == []
    assert a.metrics().deltas_oversized == 1
    b.merge_remote_state(a.local_state(False), False)
    assert b.rows("health")["a"] == {"pad": "x" * 300}


def test_rows_and_values_are_validated() -> None:
    state = ClusterState("a", StateConfig(max_row_bytes=1024))
    with pytest.raises(ValueError):
        state.set_row("health", {"x": float("nan")})
    with pytest.raises(TypeError):
        state.set_row("health", {"x": object()})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="max_row_bytes"):
        state.set_row("health", {"x": "y" * 2000})
    with pytest.raises(ValueError):
        ClusterState("bad\x1fname")
