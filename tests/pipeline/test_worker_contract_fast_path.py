"""``WorkerContract.passes``, the fast path Dispatch takes per message, agrees with ``check`` on every stream."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from node.errors import WorkerProtocolError
from node.pipeline.worker_contract import ContractLimits, Verdict, WorkerContract
from node.workers.types import WorkerOutput

VOCAB = 50

messages = st.builds(
    WorkerOutput,
    index=st.integers(-1, 2),
    token_ids=st.lists(st.integers(-1, VOCAB + 1), max_size=4),
    prompt_tokens=st.just(8),
    completion_tokens=st.just(0),
    cached_tokens=st.integers(0, 9),
    finish_reason=st.sampled_from([None, None, "stop", "length"]),
)


def _verdict(c: WorkerContract, m: WorkerOutput) -> Verdict | type[WorkerProtocolError]:
    try:
        return c.check(m)
    except WorkerProtocolError:
        return WorkerProtocolError


@given(
    stream=st.lists(messages, max_size=12),
    max_tokens=st.integers(0, 6),
    n=st.integers(1, 2),
    streamed=st.booleans(),
)
def test_passes_is_check_without_the_verdict(
    stream: list[WorkerOutput], max_tokens: int, n: int, streamed: bool
) -> None:
    limits = ContractLimits(max_tokens=max_tokens, n=n, prompt_tokens=8, vocab_size=VOCAB, stream=streamed)
    fast, slow = WorkerContract(limits), WorkerContract(limits)
    for m in stream:
        expected = _verdict(slow, m)
        if fast.passes(m):
            assert expected == Verdict((m,)), "passes only what check relays unchanged"
        else:
            assert expected != Verdict((m,)), "passes refused a message check relays as is"
            assert _verdict(fast, m) == expected
        if expected is WorkerProtocolError:
            return  # the stream is over
        assert [fast.relayed(i) for i in range(n)] == [slow.relayed(i) for i in range(n)]
        assert fast.all_finished == slow.all_finished


@given(
    batches=st.lists(st.lists(messages, min_size=1, max_size=4), max_size=6),
    max_tokens=st.integers(0, 6),
    n=st.integers(1, 2),
)
def test_passes_chunks_is_all_or_nothing(batches: list[list[WorkerOutput]], max_tokens: int, n: int) -> None:
    """The push path's check of a batch: it passes exactly when every message is an unfinished chunk that
    ``passes`` one after the other; when it refuses, the contract is as it was (the reader checks the batch)."""
    limits = ContractLimits(max_tokens=max_tokens, n=n, prompt_tokens=8, vocab_size=VOCAB, stream=True)
    batched, single = WorkerContract(limits), WorkerContract(limits)
    for batch in batches:
        before = [batched.relayed(i) for i in range(n)]
        trial = WorkerContract(limits)
        for i in range(n):  # a copy of ``single``'s state to try the batch on, one message at a time
            trial._choices[i].ids = single._choices[i].ids
            trial._choices[i].last_chunk = single._choices[i].last_chunk
            trial._choices[i].finished = single._choices[i].finished
        one_by_one = all(m.finish_reason is None and trial.passes(m) for m in batch)
        assert batched.passes_chunks(batch) == one_by_one
        if one_by_one:
            for m in batch:
                assert single.passes(m)
        else:
            assert [batched.relayed(i) for i in range(n)] == before, "a refused batch changed nothing"
            assert [c.last_chunk for c in batched._choices] == [c.last_chunk for c in single._choices]
        assert [batched.relayed(i) for i in range(n)] == [single.relayed(i) for i in range(n)]
