"""Benchmark prompts: deterministic, distinct, and of the asked Llama-3 length."""

from __future__ import annotations

import random
from pathlib import Path

from tokenizers import Tokenizer

from bench.prompts import build_pool, chat_template_overhead, load_tokenizer, sentences


def test_sentences_are_deterministic_english() -> None:
    a = [s for s, _ in zip(sentences(random.Random(1)), range(20), strict=False)]
    b = [s for s, _ in zip(sentences(random.Random(1)), range(20), strict=False)]
    assert a == b
    assert all(s[0].isupper() and s.endswith(".") for s in a)


def _tokenizer(llama3_model_dir: Path) -> Tokenizer:
    return load_tokenizer(llama3_model_dir)


def test_pool_is_sized_with_the_chat_template(llama3_model_dir: Path) -> None:
    tokenizer = _tokenizer(llama3_model_dir)
    overhead = chat_template_overhead(llama3_model_dir, tokenizer)
    assert 5 <= overhead <= 20  # <|begin_of_text|>, user and assistant headers, <|eot_id|>
    pool = build_pool(tokenizer, overhead, 1000, count=3, seed=0)
    assert all(980 <= size <= 1000 for size in pool.prompt_tokens), pool.prompt_tokens
    assert len(set(pool.bodies)) == 3
    again = build_pool(tokenizer, overhead, 1000, count=3, seed=0)
    assert again == pool


def test_every_request_text_is_distinct(llama3_model_dir: Path) -> None:
    tokenizer = _tokenizer(llama3_model_dir)
    pool = build_pool(tokenizer, 10, 100, count=2)
    texts = [pool.text(n) for n in range(100)]
    assert len(set(texts)) == 100
    assert texts[5].startswith("Request 5.")
