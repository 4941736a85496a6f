"""The worker contract: what a worker may send is bounded, whatever it sends."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from node.errors import WorkerFailed, WorkerProtocolError
from node.pipeline.worker_contract import LENGTH, ContractLimits, WorkerContract
from node.workers.types import TokenLogprobs, WorkerOutput

VOCAB = 1000


def out(ids: list[int], index: int = 0, finish: str | None = None, cached: int = 0) -> WorkerOutput:
    return WorkerOutput(
        index=index, token_ids=ids, prompt_tokens=8, completion_tokens=0, cached_tokens=cached, finish_reason=finish
    )


def contract(max_tokens: int = 20, n: int = 1, stream: bool = True) -> WorkerContract:
    return WorkerContract(ContractLimits(max_tokens=max_tokens, n=n, prompt_tokens=8, vocab_size=VOCAB, stream=stream))


def relay(c: WorkerContract, messages: list[WorkerOutput]) -> tuple[dict[int, list[int]], dict[int, str], bool]:
    """Feed messages until the verdict says abort; the ids and finish reasons the pipeline would see."""
    ids: dict[int, list[int]] = {}
    finish: dict[int, str] = {}
    last: dict[int, tuple[int, ...]] = {}
    for m in messages:
        verdict = c.check(m)
        for o in verdict.outputs:
            repeat = c.limits.stream and o.finish_reason is not None and tuple(o.token_ids) == last.get(o.index)
            if not repeat:
                ids.setdefault(o.index, []).extend(o.token_ids)
            if o.finish_reason is None:
                last[o.index] = tuple(o.token_ids)
            else:
                finish[o.index] = o.finish_reason
        if verdict.abort_stream:
            return ids, finish, True
    return ids, finish, False


def test_an_endless_worker_is_cut_at_max_tokens_and_aborted() -> None:
    c = contract(max_tokens=20)
    endless = (out([7, 8, 9]) for _ in range(10**9))
    ids: list[int] = []
    seen = 0
    for m in endless:
        seen += 1
        verdict = c.check(m)
        ids += [t for o in verdict.outputs if o.finish_reason is None for t in o.token_ids]
        if verdict.abort_stream:
            assert verdict.overrun
            assert verdict.outputs[-1].finish_reason == LENGTH
            break
    assert len(ids) == 20 and seen == 7


def test_one_huge_chunk_is_cut_to_max_tokens() -> None:
    c = contract(max_tokens=20)
    verdict = c.check(out(list(range(3)) * 1_000_000))
    chunk, final = verdict.outputs
    assert list(chunk.token_ids) == [0, 1, 2] * 6 + [0, 1]
    assert chunk.finish_reason is None and final.finish_reason == LENGTH
    assert tuple(final.token_ids) == tuple(chunk.token_ids)  # the repeating final message, as vLLM frames it
    assert verdict.abort_stream and verdict.overrun


def test_a_cut_keeps_logprobs_aligned() -> None:
    c = contract(max_tokens=2, stream=False)
    lp = TokenLogprobs(token_ids=(1, 2, 3), logprobs=(-0.1, -0.2, -0.3), top_ids=((1,), (2,), (3,)),
                       top_logprobs=((-0.1,), (-0.2,), (-0.3,)))  # fmt: skip
    message = WorkerOutput(0, [1, 2, 3], 8, 3, 0, finish_reason="stop", logprobs=lp)
    (final,) = c.check(message).outputs
    assert final.logprobs is not None and list(final.logprobs.logprobs) == [-0.1, -0.2]
    assert final.finish_reason == LENGTH and list(final.token_ids) == [1, 2]


def test_a_well_behaved_stream_passes_unchanged() -> None:
    c = contract(max_tokens=4, n=2)
    messages = [out([1], 0), out([2], 1), out([3, 4], 0), out([5, 6], 1), out([9], 0), out([9], 0, "length")]
    messages += [out([8], 1), out([8], 1, "length")]
    for m in messages:
        verdict = c.check(m)
        assert verdict.outputs == (m,) and not verdict.abort_stream and not verdict.overrun
    assert c.all_finished and c.relayed(0) == 4 and c.relayed(1) == 4


@pytest.mark.parametrize("bad", [-1, VOCAB, 2**32 - 1])
def test_an_id_outside_the_vocabulary_is_a_worker_fault(bad: int) -> None:
    c = contract()
    c.check(out([1, 2]))
    with pytest.raises(WorkerProtocolError, match=f"token id {bad} outside"):
        c.check(out([3, bad]))
    assert issubclass(WorkerProtocolError, WorkerFailed)


def test_an_unknown_vocabulary_checks_no_ids() -> None:
    c = WorkerContract(ContractLimits(max_tokens=5, n=1, prompt_tokens=1, vocab_size=0))
    assert c.check(out([10**9], cached=0)).outputs


def test_more_cached_than_prompt_tokens_is_a_worker_fault() -> None:
    with pytest.raises(WorkerProtocolError, match="4294967295 cached tokens of a 8-token prompt"):
        contract().check(out([1], cached=2**32 - 1))
    assert contract().check(out([1], cached=8)).outputs


@pytest.mark.parametrize("index", [1, 5, -1])
def test_a_choice_index_beyond_n_is_a_worker_fault(index: int) -> None:
    with pytest.raises(WorkerProtocolError, match=f"choice index {index} of n=1"):
        contract(n=1).check(out([1], index=index))


def test_messages_after_a_choice_finished_are_dropped() -> None:
    c = contract(max_tokens=5, n=2)
    c.check(out([1], 0, "stop"))
    assert c.check(out([2, 3], 0)).outputs == ()
    assert c.check(out([2], 1)).outputs  # the other choice goes on


chunks = st.lists(
    st.tuples(st.integers(0, 2), st.lists(st.integers(0, VOCAB - 1), max_size=12), st.booleans()), max_size=30
)


@given(max_tokens=st.integers(0, 25), n=st.integers(1, 3), stream=st.booleans(), messages=chunks)
def test_no_choice_ever_gets_more_than_max_tokens(
    max_tokens: int, n: int, stream: bool, messages: list[tuple[int, list[int], bool]]
) -> None:
    c = contract(max_tokens=max_tokens, n=n, stream=stream)
    sent: dict[int, list[int]] = {}
    feed = [out(ids, index % n, "stop" if fin else None) for index, ids, fin in messages]
    ids, finish, aborted = relay(c, feed)
    for m in feed:
        sent.setdefault(m.index, []).extend(m.token_ids)
    for index, got in ids.items():
        assert len(got) <= max_tokens
        assert got == sent[index][: len(got)]  # relayed ids are a prefix of what the worker sent, in order
        assert c.relayed(index) <= max_tokens
    assert aborted == any(r == LENGTH for r in finish.values())  # only a cut aborts; the cut says length


@given(max_tokens=st.integers(1, 40), sizes=st.lists(st.integers(1, 5), min_size=1, max_size=20))
def test_a_stream_within_max_tokens_is_never_cut(max_tokens: int, sizes: list[int]) -> None:
    c = contract(max_tokens=max_tokens)
    total = 0
    size = 0
    for wanted in sizes:
        size = min(wanted, max_tokens - total)
        if size == 0:
            break
        total += size
        verdict = c.check(out([1] * size))
        assert not verdict.abort_stream and not verdict.overrun
    verdict = c.check(out([1] * size, finish="length"))  # the repeating final message
    assert verdict.outputs[0].finish_reason == "length" and not verdict.overrun
