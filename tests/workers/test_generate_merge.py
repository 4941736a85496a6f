"""Generate messages that arrive together: a run of chunks for the one choice leaves the worker client as two
WorkerOutputs (the run without its last message, then that message as sent), never changing what they say."""

from __future__ import annotations

import pytest
from google.protobuf.message import DecodeError  # type: ignore[import-untyped,unused-ignore]
from hypothesis import given, settings
from hypothesis import strategies as st
from smg_grpc_proto.generated import vllm_engine_pb2 as pb

from node.workers.types import WorkerOutput
from node.workers.vllm_grpc import _outputs

PARSE = pb.GenerateResponse.FromString
PROMPT = 17


def _chunk(ids: list[int], completion: int, cached: int, index: int = 0) -> bytes:
    chunk = pb.GenerateStreamChunk(
        token_ids=ids, prompt_tokens=PROMPT, completion_tokens=completion, cached_tokens=cached, index=index
    )
    return pb.GenerateResponse(chunk=chunk).SerializeToString()


def _complete(ids: list[int], completion: int) -> bytes:
    done = pb.GenerateComplete(
        output_ids=ids, finish_reason="length", prompt_tokens=PROMPT, completion_tokens=completion
    )
    return pb.GenerateResponse(complete=done).SerializeToString()


@st.composite
def batches(draw: st.DrawFn) -> list[bytes]:
    """One read's messages: chunks (cumulative counts, a cached count that may move), maybe the final one."""
    sizes = draw(st.lists(st.integers(0, 4), min_size=1, max_size=12))
    ids = iter(draw(st.lists(st.integers(0, 2**32 - 1), min_size=sum(sizes), max_size=sum(sizes))))
    out: list[bytes] = []
    completion = draw(st.integers(0, 100))
    last: list[int] = []
    for size in sizes:
        last = [next(ids) for _ in range(size)]
        completion += size
        out.append(_chunk(last, completion, draw(st.integers(0, PROMPT))))
    if draw(st.booleans()):
        out.append(_complete(last, completion))  # as vLLM's servicer: the last chunk's ids again
    return out


def _ids(outs: list[WorkerOutput]) -> list[int]:
    return [t for o in outs if o.finish_reason is None for t in o.token_ids]


@settings(max_examples=200, deadline=None)
@given(batch=batches())
def test_a_merged_batch_says_what_the_messages_say(batch: list[bytes]) -> None:
    alone = _outputs(batch, PARSE, merge=False)
    merged = _outputs(batch, PARSE, merge=True)
    assert len(alone) == len(batch)
    assert _ids(merged) == _ids(alone)
    # The last chunk and the final message leave as sent: the final one is compared with the last chunk.
    last_chunk = [o for o in alone if o.finish_reason is None][-1]
    assert [o for o in merged if o.finish_reason is None][-1] == last_chunk
    assert [o for o in merged if o.finish_reason] == [o for o in alone if o.finish_reason]
    assert [o.finish_reason for o in merged if o.finish_reason] == [o.finish_reason for o in alone if o.finish_reason]
    assert max(o.cached_tokens for o in merged) == max(o.cached_tokens for o in alone)
    chunks = sum(1 for o in alone if o.finish_reason is None)
    assert len(merged) == (len(alone) if chunks < 3 else len(alone) - chunks + 2)


def test_a_chunk_for_another_choice_is_left_for_the_contract() -> None:
    batch = [_chunk([1], 1, 0), _chunk([2], 2, 0, index=3), _chunk([3], 3, 0), _chunk([4], 4, 0)]
    merged = _outputs(batch, PARSE, merge=True)
    assert [o.index for o in merged] == [0, 3, 0, 0]  # as sent: the contract refuses index 3 of n=1


def test_a_malformed_message_fails_as_it_would_alone() -> None:
    good = _chunk([5, 6], 2, 0)
    bad = good[:-1]  # cut inside the token ids
    with pytest.raises(DecodeError):
        _outputs([good, bad, good, good], PARSE, merge=False)
    with pytest.raises(DecodeError):
        _outputs([good, bad, good, good], PARSE, merge=True)
