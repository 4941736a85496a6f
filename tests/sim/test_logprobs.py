"""Simulated logprobs are deterministic and shaped like vLLM's."""

from __future__ import annotations

from node.sim.logprobs import simulate


def test_logprobs_deterministic_sorted_and_negative() -> None:
    a = simulate([5, 9, 5], start=0, top_n=3, vocab_size=100)
    assert a == simulate([5, 9, 5], start=0, top_n=3, vocab_size=100)
    assert (
        a.logprobs[0] != simulate([5], start=2, top_n=3, vocab_size=100).logprobs[0] or a.logprobs[2] != a.logprobs[0]
    )
    for token, value, ids, values in zip(a.token_ids, a.logprobs, a.top_ids, a.top_logprobs, strict=True):
        assert value < 0 and ids[0] == token and values[0] == value
        assert list(values) == sorted(values, reverse=True) and len(ids) == 3
        assert all(0 <= i < 100 for i in ids)
