"""The Messages ``thinking`` budget end to end: the official ``anthropic`` SDK against a real node in front of
a simulated Qwen3 engine over gRPC. The engine thinks for as long as it likes; at the budget the gateway
closes the block (``</think>\\n\\n``) and the engine, given that prompt, answers (node/sim/answers.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from anthropic import AsyncAnthropic
from anthropic.types import Message

from node.pipeline.tokenizer import Tokenizer
from tests.http.conftest import start_cluster

pytestmark = pytest.mark.asyncio(loop_scope="module")

ASK: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
BUDGET = 1024
# Each answer (reasoning, then text) is drawn from [mean/2, 3*mean/2] tokens: every thought outruns BUDGET.
MEAN_TOKENS = 2400


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def client(qwen_model_dir: Path) -> AsyncIterator[AsyncAnthropic]:
    async with (
        start_cluster(qwen_model_dir, workers=1, eos_after_tokens=MEAN_TOKENS, tpot_ms=0.02) as c,
        AsyncAnthropic(base_url=c.node.url, api_key="unused", max_retries=0, timeout=60) as anthropic,
    ):
        yield anthropic


async def ask(client: AsyncAnthropic, *, stream: bool, **kw: Any) -> Message:
    if stream:
        async with client.messages.stream(model="qwen", messages=ASK, **kw) as s:
            return await s.get_final_message()
    return await client.messages.create(model="qwen", messages=ASK, **kw)


def shape(m: Message) -> list[Any]:
    return [m.stop_reason, m.usage.input_tokens, m.usage.output_tokens, *((b.type, b.model_dump()) for b in m.content)]


async def test_a_small_budget_ends_the_thinking_and_the_model_answers(
    client: AsyncAnthropic, qwen_tokenizer: Tokenizer
) -> None:
    thinking = {"type": "enabled", "budget_tokens": BUDGET}
    m = await ask(client, stream=False, max_tokens=8000, thinking=thinking)
    assert m.stop_reason == "end_turn" and [b.type for b in m.content] == ["thinking", "text"]
    block, text = m.content
    assert block.type == "thinking" and block.signature and text.type == "text" and text.text.strip()
    assert len(qwen_tokenizer.encode(block.thinking, add_special_tokens=False)) <= BUDGET
    # Output tokens, once each: <think>, the budget, the gateway's </think> and "\n\n", then the answer and
    # its end token. The answer's own count is known here only by re-encoding its text, which may split a
    # word differently from the engine (exact accounting: tests/http/test_anthropic.py's scripted model).
    answer = len(qwen_tokenizer.encode(text.text, add_special_tokens=False))
    assert abs(m.usage.output_tokens - (1 + BUDGET + 2 + answer + 1)) <= 2 and m.usage.output_tokens < 8000
    # The engine is deterministic in its prompt: streaming changes nothing, and neither does a second run.
    assert shape(await ask(client, stream=True, max_tokens=8000, thinking=thinking)) == shape(m)


async def test_a_budget_larger_than_the_reasoning_changes_nothing(client: AsyncAnthropic) -> None:
    # Qwen3 thinks by default ("adaptive": the template's default, no budget): the same prompt, so the same
    # engine answer, as "enabled" with a budget the reasoning never reaches.
    # (Streamed against not streamed: the first test shows streaming changes nothing either.)
    unbounded = await ask(client, stream=False, max_tokens=16000, thinking={"type": "adaptive"})
    m = await ask(client, stream=True, max_tokens=16000, thinking={"type": "enabled", "budget_tokens": 12000})
    assert [b.type for b in m.content] == ["thinking", "text"] and m.stop_reason == "end_turn"
    assert shape(m) == shape(unbounded)


async def test_max_tokens_reached_after_the_budget(client: AsyncAnthropic) -> None:
    thinking = {"type": "enabled", "budget_tokens": BUDGET}
    limit = 1 + BUDGET + 2 + 10  # ten tokens of answer
    for stream in (False, True):
        m = await ask(client, stream=stream, max_tokens=limit, thinking=thinking)
        assert m.stop_reason == "max_tokens" and m.usage.output_tokens == limit
        assert [b.type for b in m.content] == ["thinking", "text"]
        assert m.content[1].type == "text" and m.content[1].text.strip()
