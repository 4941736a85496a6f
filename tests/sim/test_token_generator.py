"""The answer generator: deterministic, readable, and ending as vLLM's stop rules say."""

from __future__ import annotations

import random
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from node.sim import SimModel
from node.sim.token_generator import EosPolicy, Finish, SamplingSpec, TokenStream, answer_length
from node.sim.vocabulary import TextVocabulary

VOCAB = TextVocabulary(
    words=tuple(range(100, 200)),
    function_words=tuple(range(10, 15)),
    capitalized=tuple(range(50, 60)),
    comma=1,
    period=2,
)
PRIMARY_EOS = 900
OTHER_EOS = 901
EOS = EosPolicy(PRIMARY_EOS, (PRIMARY_EOS, OTHER_EOS))
PROMPT = (7, 8, 9, 10, 11)


def stream(
    sampling: SamplingSpec | None = None,
    *,
    prompt: tuple[int, ...] = PROMPT,
    index: int = 0,
    engine_seed: int = 0,
    eos_after_tokens: int = 20,
    max_tokens: int = 10_000,
    vocabulary: TextVocabulary = VOCAB,
    eos: EosPolicy = EOS,
) -> TokenStream:
    return TokenStream(
        vocabulary=vocabulary,
        eos=eos,
        sampling=sampling or SamplingSpec(),
        prompt_ids=prompt,
        index=index,
        engine_seed=engine_seed,
        eos_after_tokens=eos_after_tokens,
        max_tokens=max_tokens,
    )


def run(token_stream: TokenStream, chunk: int = 1) -> tuple[list[int], Finish]:
    tokens: list[int] = []
    while True:
        new, finish = token_stream.take(chunk)
        tokens.extend(new)
        if finish is not None:
            assert token_stream.take(chunk) == ([], finish)
            return tokens, finish


def test_same_request_gives_same_answer() -> None:
    assert run(stream()) == run(stream())
    seeded = SamplingSpec(seed=1234)
    assert run(stream(seeded)) == run(stream(seeded))


def test_seed_prompt_index_engine_seed_and_knobs_each_change_the_answer() -> None:
    base = run(stream())[0]
    assert run(stream(SamplingSpec(seed=1)))[0] != base
    assert run(stream(SamplingSpec(seed=1)))[0] != run(stream(SamplingSpec(seed=2)))[0]
    assert run(stream(prompt=(*PROMPT, 12)))[0] != base
    assert run(stream(index=1))[0] != base
    assert run(stream(engine_seed=5))[0] != base
    assert run(stream(SamplingSpec(knobs=(0.7, 0.9))))[0] != base


def test_answer_ends_with_the_primary_eos_and_no_matched_id() -> None:
    tokens, finish = run(stream())
    assert tokens[-1] == PRIMARY_EOS
    assert finish == Finish("stop", None)
    assert PRIMARY_EOS not in tokens[:-1]
    assert tokens[-2] == VOCAB.period
    assert 10 <= len(tokens) - 1 <= 30  # eos_after_tokens=20 draws from [10, 30]


def test_answer_lengths_vary_around_the_mean() -> None:
    lengths = {len(run(stream(prompt=(i, i + 1)))[0]) - 1 for i in range(40)}
    assert len(lengths) > 5
    assert min(lengths) >= 10
    assert max(lengths) <= 30


def test_max_tokens_cuts_with_length_and_the_cap_wins_over_eos() -> None:
    full, _ = run(stream())
    cut, finish = run(stream(max_tokens=5))
    assert cut == full[:5]
    assert finish == Finish("length")
    # vLLM checks the length cap first: an EOS landing exactly on the cap still reports "length".
    capped, finish = run(stream(max_tokens=len(full)))
    assert capped == full
    assert finish == Finish("length")


def test_min_tokens_delays_the_end() -> None:
    tokens, finish = run(stream(SamplingSpec(min_tokens=200)))
    assert len(tokens) == 201
    assert tokens[-1] == PRIMARY_EOS
    assert finish.reason == "stop"
    assert PRIMARY_EOS not in tokens[:-1]


def test_ignore_eos_runs_to_max_tokens() -> None:
    tokens, finish = run(stream(SamplingSpec(ignore_eos=True), max_tokens=300))
    assert len(tokens) == 300
    assert finish == Finish("length")
    assert PRIMARY_EOS not in tokens
    assert OTHER_EOS not in tokens


def test_request_stop_token_ends_the_answer_with_matched_id() -> None:
    tokens, finish = run(stream(SamplingSpec(stop_token_ids=(777, 778))))
    assert tokens[-1] == 777
    assert finish == Finish("stop", 777)
    # Stop ids end the answer even when EOS is ignored.
    _, finish = run(stream(SamplingSpec(stop_token_ids=(777,), ignore_eos=True)))
    assert finish == Finish("stop", 777)


def test_a_secondary_eos_reports_its_id() -> None:
    only_secondary = EosPolicy(OTHER_EOS, (PRIMARY_EOS, OTHER_EOS))
    _, finish = run(stream(SamplingSpec(stop_token_ids=(PRIMARY_EOS,)), eos=only_secondary))
    assert finish == Finish("stop", PRIMARY_EOS)


def test_a_word_that_is_a_stop_id_is_masked_before_min_tokens() -> None:
    tiny = TextVocabulary(words=(100, 101), function_words=(), capitalized=(), comma=None, period=None)
    tokens, finish = run(stream(SamplingSpec(stop_token_ids=(100,), min_tokens=30), vocabulary=tiny))
    assert 100 not in tokens[:30]
    assert len(tokens) >= 31
    assert finish == Finish("stop", 100)


def test_no_eos_in_the_model_ends_by_length() -> None:
    tokens, finish = run(stream(eos=EosPolicy(None), max_tokens=50))
    assert len(tokens) == 50
    assert finish == Finish("length")


def test_answer_length_draw() -> None:
    rng = random.Random(0)
    assert answer_length(0, rng) == 0
    assert all(1 <= answer_length(1, rng) <= 2 for _ in range(50))
    assert all(32 <= answer_length(64, rng) <= 96 for _ in range(200))


@settings(max_examples=60, deadline=None)
@given(
    prompt=st.lists(st.integers(0, 5000), min_size=1, max_size=40).map(tuple),
    chunk=st.integers(1, 9),
    max_tokens=st.integers(1, 120),
    min_tokens=st.integers(0, 60),
    seed=st.none() | st.integers(-(2**31), 2**31 - 1),
)
def test_chunking_never_changes_the_answer(
    prompt: tuple[int, ...], chunk: int, max_tokens: int, min_tokens: int, seed: int | None
) -> None:
    sampling = SamplingSpec(min_tokens=min(min_tokens, max_tokens), seed=seed)
    one_by_one = run(stream(sampling, prompt=prompt, max_tokens=max_tokens))
    chunked = run(stream(sampling, prompt=prompt, max_tokens=max_tokens), chunk=chunk)
    assert one_by_one == chunked
    tokens, finish = one_by_one
    assert len(tokens) <= max_tokens
    assert len(tokens) >= min(max_tokens, sampling.min_tokens)
    if finish.reason == "stop":
        assert len(tokens) > sampling.min_tokens


def test_answers_read_like_text(sim_model: SimModel) -> None:
    tokenizer = sim_model.tokenizer
    folder = sim_model.folder
    eos = EosPolicy(folder.primary_eos_token_id, folder.stop_eos_token_ids)
    tokens, finish = run(
        stream(vocabulary=sim_model.vocabulary, eos=eos, prompt=(128000, 9906, 1917), eos_after_tokens=40)
    )
    assert finish == Finish("stop")
    assert tokens[-1] == 128009  # <|eot_id|>, the tokenizer's eos_token
    text = tokenizer.decode(tokens[:-1])
    assert re.fullmatch(r" [A-Z][a-z]+([,.]? [A-Za-z]+)*\.", text), text
