"""The prompt's ids written as protobuf's packed field by hand: what a parser reads back is the prompt."""

from __future__ import annotations

from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from smg_grpc_proto.generated import vllm_engine_pb2 as pb

from node.workers import _packed, packed_ids
from node.workers.packed_ids import packed_uint32, varint
from node.workers.vllm_grpc import _tokenized_field

_IDS = st.lists(st.integers(min_value=0, max_value=2**28 - 1), max_size=3000)


def test_the_extension_is_built() -> None:
    # An install without a C compiler writes the ids through big ints instead (tested below as well).
    assert packed_ids._NATIVE


@settings(max_examples=200, deadline=None)
@given(ids=_IDS)
def test_the_request_parses_back_to_the_same_message(ids: list[int]) -> None:
    # What the engine receives: the request protobuf writes, with the tokenized field from the array.
    msg = pb.GenerateRequest(request_id="r-1", stream=True)
    msg.kv_transfer_params_json = "{}"
    pieces = _tokenized_field(array("i", ids))
    assert pieces is not None
    parsed = pb.GenerateRequest.FromString(b"".join((msg.SerializeToString(), *pieces)))
    msg.tokenized.SetInParent()
    msg.tokenized.input_ids.extend(ids)
    assert parsed == msg
    assert parsed.WhichOneof("input") == "tokenized" and list(parsed.tokenized.input_ids) == ids


@settings(max_examples=200, deadline=None)
@given(ids=st.lists(st.integers(min_value=0, max_value=2**31 - 1), max_size=3000))
def test_the_extension_writes_the_bytes_protobuf_writes(ids: list[int]) -> None:
    packed = _packed.packed_uint32(array("i", ids))
    assert packed is not None
    field = b"\x12" + varint(len(packed)) + packed if ids else b""  # protobuf leaves an empty field out
    assert field == pb.TokenizedInput(input_ids=ids).SerializeToString()


@settings(max_examples=100, deadline=None)
@given(ids=_IDS)
def test_the_big_int_fallback_parses_back(ids: list[int]) -> None:
    packed = packed_ids._spread(array("i", ids))
    assert packed is not None and len(packed) == 4 * len(ids)
    assert list(pb.TokenizedInput.FromString(b"\x12" + varint(len(packed)) + packed).input_ids) == ids


def test_negative_ids_are_left_to_protobuf() -> None:
    assert packed_uint32(array("i", [5, -1])) is None
    assert packed_ids._spread(array("i", [5, -1])) is None
    assert packed_ids._spread(array("i", [5, 2**28])) is None  # the fallback's lanes hold 28 bits
    assert packed_uint32(array("i", [2**28])) == b"\x80\x80\x80\x80\x01"
    assert packed_uint32(array("I", [2**32 - 1])) == b"\xff\xff\xff\xff\x0f"  # unsigned items: any value
    assert _tokenized_field([1, 2, 3]) is None, "a list (a client's token prompt) goes through protobuf"
    with pytest.raises(TypeError):
        _packed.packed_uint32(array("h", [1, 2]))


def test_the_fallback_after_a_long_prompt() -> None:
    # The fallback's masks grow past their first size and still serve shorter prompts.
    for n in (3, 5000, 40000, 7):
        ids = [(i * 7919) % 152064 for i in range(n)]
        packed = packed_ids._spread(array("i", ids))
        assert packed is not None and len(packed) == 4 * n
        field = pb.TokenizedInput.FromString(b"\x12" + varint(len(packed)) + packed)
        assert list(field.input_ids) == ids
