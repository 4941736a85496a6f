"""The prompt's ids written as protobuf's packed field by hand: what a parser reads back is the prompt."""

from __future__ import annotations

from array import array

from hypothesis import given, settings
from hypothesis import strategies as st
from smg_grpc_proto.generated import vllm_engine_pb2 as pb

from node.workers.packed_ids import packed_uint32, varint
from node.workers.vllm_grpc import _tokenized_field

_IDS = st.lists(st.integers(min_value=0, max_value=2**28 - 1), max_size=3000)


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


def test_ids_beyond_28_bits_or_negative_are_left_to_protobuf() -> None:
    assert packed_uint32(array("i", [5, 2**28])) is None
    assert packed_uint32(array("i", [5, -1])) is None
    assert packed_uint32(array("i", [2**28 - 1])) == b"\xff\xff\xff\x7f"
    assert _tokenized_field([1, 2, 3]) is None, "a list (a client's token prompt) goes through protobuf"


def test_a_long_prompt_after_a_short_one() -> None:
    # The masks grow past their first size and still serve shorter prompts.
    for n in (3, 5000, 40000, 7):
        ids = [(i * 7919) % 152064 for i in range(n)]
        packed = packed_uint32(array("i", ids))
        assert packed is not None and len(packed) == 4 * n
        field = pb.TokenizedInput.FromString(b"\x12" + varint(len(packed)) + packed)
        assert list(field.input_ids) == ids
