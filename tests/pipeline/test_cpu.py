"""Where tokenization runs: the cache lookup on the loop, the encoding it leaves there or on the pool."""

from __future__ import annotations

import threading
from array import array
from typing import cast

import pytest

from node.config import TokenizerCacheConfig
from node.pipeline import cpu
from node.pipeline.cpu import CpuPool
from node.pipeline.token_cache import EncodeJob
from node.pipeline.tokenizer import Tokenizer


class _Recording:
    """A tokenizer whose every encode notes the thread that ran it."""

    def __init__(self, real: Tokenizer) -> None:
        self.real = real
        self.threads: list[str] = []
        self.lookups: list[str] = []

    def prepare(self, text: str, *, add_special_tokens: bool) -> EncodeJob:
        self.lookups.append(threading.current_thread().name)
        job = self.real.prepare(text, add_special_tokens=add_special_tokens)

        def ids() -> array[int]:
            self.threads.append(threading.current_thread().name)
            return job.ids()

        return EncodeJob(job.pending_chars, ids)

    def encode_ids(self, text: str, *, add_special_tokens: bool) -> array[int]:
        self.threads.append(threading.current_thread().name)
        return self.real.encode_ids(text, add_special_tokens=add_special_tokens)


@pytest.fixture
def pool() -> CpuPool:
    return CpuPool(threads=1)


async def test_a_cached_prompt_is_finished_on_the_loop_and_a_new_one_on_the_pool(
    llama3_tokenizer: Tokenizer, pool: CpuPool
) -> None:
    tok = _Recording(llama3_tokenizer.with_cache(TokenizerCacheConfig()))
    loop_thread = threading.current_thread().name
    turn = "<|start_header_id|>system<|end_header_id|>\n\n" + "A long shared system prompt. " * 300 + "<|eot_id|>"
    first = turn + "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
    second = first + "<|start_header_id|>assistant<|end_header_id|>\n\nHello<|eot_id|>"
    assert len(first) > cpu.INLINE_MAX_CHARS
    ids = await pool.encode(cast(Tokenizer, tok), first, add_special_tokens=False)
    assert ids.tolist() == llama3_tokenizer.encode_uncached(first, add_special_tokens=False)
    ids = await pool.encode(cast(Tokenizer, tok), second, add_special_tokens=False)
    assert ids.tolist() == llama3_tokenizer.encode_uncached(second, add_special_tokens=False)
    assert tok.threads[0].startswith("smg-cpu"), "the first turn is all new text: a thread encodes it"
    assert tok.threads[1] == loop_thread, "the next turn only adds a few characters: encoded inline"
    assert tok.lookups == [loop_thread, loop_thread]
    pool.close()


async def test_a_huge_text_is_not_even_looked_up_on_the_loop(llama3_tokenizer: Tokenizer, pool: CpuPool) -> None:
    tok = _Recording(llama3_tokenizer)
    text = "word " * (cpu.LOOKUP_INLINE_MAX_CHARS // 5 + 1)
    ids = await pool.encode(cast(Tokenizer, tok), text, add_special_tokens=True)
    assert ids.tolist() == llama3_tokenizer.encode_uncached(text, add_special_tokens=True)
    assert tok.lookups == [], "hashing megabytes on the loop would stall it"
    assert len(tok.threads) == 1 and tok.threads[0].startswith("smg-cpu")
    pool.close()


async def test_a_very_long_conversation_is_rendered_on_the_pool_and_a_short_one_inline(
    llama3_tokenizer: Tokenizer, pool: CpuPool
) -> None:
    rendered_on: list[str] = []

    def render() -> str:
        rendered_on.append(threading.current_thread().name)
        return "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"

    expected = llama3_tokenizer.encode_uncached(render(), add_special_tokens=False)
    rendered_on.clear()
    assert (await pool.render_and_encode(100, render, llama3_tokenizer)).tolist() == expected
    big = cpu.RENDER_INLINE_MAX_CHARS + 1
    assert (await pool.render_and_encode(big, render, llama3_tokenizer)).tolist() == expected
    assert rendered_on[0] == threading.current_thread().name
    assert rendered_on[1].startswith("smg-cpu")
    pool.close()


async def test_warm_runs_on_every_pool_thread_before_any_request() -> None:
    pool = CpuPool(threads=3)
    ran_on: list[str] = []
    await pool.warm(lambda: ran_on.append(threading.current_thread().name))
    assert len(set(ran_on)) == 3 and all(name.startswith("smg-cpu") for name in ran_on)
    pool.close()
