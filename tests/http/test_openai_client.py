"""The official openai client, unchanged, against a node in front of simulated gRPC workers."""

from __future__ import annotations

import pytest

from node.pipeline.tokenizer import Tokenizer
from tests.http.conftest import Cluster

pytestmark = pytest.mark.asyncio(loop_scope="module")

HELLO = [{"role": "user", "content": "Hello there, how are you?"}]
LLAMA3_HELLO_PROMPT = (
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello there, how are you?<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\n"
)


VLLM_EXTRAS = ("ignore_eos", "include_stop_str_in_output")


async def _text(cluster: Cluster, **kw: object) -> tuple[str, str | None, object]:
    extra = {k: kw.pop(k) for k in VLLM_EXTRAS if k in kw}
    r = await cluster.client.chat.completions.create(model=cluster.model, messages=HELLO, extra_body=extra, **kw)  # type: ignore[call-overload]
    return r.choices[0].message.content or "", r.choices[0].finish_reason, r.usage


async def test_chat_answers_with_exact_prompt_usage(cluster: Cluster, llama3_tokenizer: Tokenizer) -> None:
    r = await cluster.client.chat.completions.create(model=cluster.model, messages=HELLO, max_tokens=20, seed=3)
    choice = r.choices[0]
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert choice.message.role == "assistant"
    assert len(choice.message.content or "") > 20, "the simulated engine answers with words"
    assert "\ufffd" not in (choice.message.content or "")
    assert choice.finish_reason == "length"
    assert r.usage is not None
    assert r.usage.prompt_tokens == len(llama3_tokenizer.encode(LLAMA3_HELLO_PROMPT, add_special_tokens=False))
    assert r.usage.completion_tokens == 20
    assert r.usage.total_tokens == r.usage.prompt_tokens + 20


async def test_same_seed_same_answer_on_any_worker(cluster: Cluster) -> None:
    # Round robin sends consecutive requests to different workers.
    answers = {(await _text(cluster, max_tokens=16, seed=11))[0] for _ in range(4)}
    assert len(answers) == 1
    other, _, _ = await _text(cluster, max_tokens=16, seed=12)
    assert other not in answers


async def test_eos_ends_the_answer_with_stop(cluster: Cluster) -> None:
    text, reason, usage = await _text(cluster, max_tokens=1000, seed=5)
    assert reason == "stop"
    assert usage is not None and 0 < usage.completion_tokens < 1000  # type: ignore[attr-defined]
    assert "<|eot_id|>" not in text and "<|end_of_text|>" not in text


async def test_streaming_matches_non_streaming_and_reports_usage(cluster: Cluster) -> None:
    full, reason, usage = await _text(cluster, max_tokens=40, seed=21, ignore_eos=True)
    stream = await cluster.client.chat.completions.create(
        model=cluster.model,
        messages=HELLO,
        max_tokens=40,
        seed=21,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = [c async for c in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    content_chunks = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content_chunks) > 1, "the answer streams in pieces"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == full
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["length"] == [reason]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 40 == usage.completion_tokens  # type: ignore[attr-defined]
    assert chunks[-1].usage.prompt_tokens == usage.prompt_tokens  # type: ignore[attr-defined]
    assert all(c.usage is None for c in chunks[:-1])


async def _stop_candidates(cluster: Cluster) -> tuple[str, list[str]]:
    full, _, _ = await _text(cluster, max_tokens=60, seed=8, ignore_eos=True)
    words = full.split(" ")
    assert len(words) > 12
    return full, words


async def test_stop_string_ends_the_answer_and_is_not_emitted(cluster: Cluster) -> None:
    full, words = await _stop_candidates(cluster)
    stop = " " + words[8]
    expected = full[: full.index(stop)]
    for stream in (False, True):
        if stream:
            s = await cluster.client.chat.completions.create(
                model=cluster.model,
                messages=HELLO,
                max_tokens=60,
                seed=8,
                stop=[stop],
                stream=True,
                extra_body={"ignore_eos": True},
            )
            chunks = [c async for c in s]
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            reason = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
            assert reason == ["stop"]
        else:
            text, r, usage = await _text(cluster, max_tokens=60, seed=8, stop=stop, ignore_eos=True)
            assert r == "stop"
            assert usage.completion_tokens < 60  # type: ignore[attr-defined]
        assert text == expected


async def test_stop_string_spanning_tokens_and_include_stop_str(cluster: Cluster) -> None:
    full, words = await _stop_candidates(cluster)
    # The end of one word, the space and the start of the next: the stop spans a token boundary.
    stop = words[6][-2:] + " " + words[7][:2]
    first = full.index(stop)
    text, reason, _ = await _text(cluster, max_tokens=60, seed=8, stop=[stop], ignore_eos=True)
    assert (text, reason) == (full[:first], "stop")
    text, reason, _ = await _text(
        cluster, max_tokens=60, seed=8, stop=[stop], ignore_eos=True, include_stop_str_in_output=True
    )
    assert (text, reason) == (full[: first + len(stop)], "stop")


async def test_n_choices(cluster: Cluster) -> None:
    r = await cluster.client.chat.completions.create(model=cluster.model, messages=HELLO, max_tokens=12, n=3, seed=1)
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    assert all(c.finish_reason == "length" and c.message.content for c in r.choices)
    assert r.usage is not None and r.usage.completion_tokens == 36


async def test_logprobs(cluster: Cluster) -> None:
    r = await cluster.client.chat.completions.create(
        model=cluster.model, messages=HELLO, max_tokens=5, logprobs=True, top_logprobs=2, seed=4
    )
    lp = r.choices[0].logprobs
    assert lp is not None and lp.content is not None and len(lp.content) == 5
    assert "".join(t.token for t in lp.content) == r.choices[0].message.content
    assert all(t.logprob <= 0 and len(t.top_logprobs) == 2 for t in lp.content)


async def test_completions_text_tokens_batch_echo(cluster: Cluster, llama3_tokenizer: Tokenizer) -> None:
    prompt = "The quick brown fox"
    r = await cluster.client.completions.create(model=cluster.model, prompt=prompt, max_tokens=7, seed=2)
    assert r.object == "text_completion" and r.choices[0].finish_reason == "length" and r.choices[0].text
    ids = llama3_tokenizer.encode(prompt, add_special_tokens=True)
    assert ids[0] == 128000
    assert r.usage is not None and r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == 7

    by_ids = await cluster.client.completions.create(model=cluster.model, prompt=ids, max_tokens=7, seed=2)
    assert by_ids.choices[0].text == r.choices[0].text

    batch = await cluster.client.completions.create(
        model=cluster.model, prompt=[prompt, "Once upon a time"], max_tokens=4, seed=2
    )
    assert [c.index for c in sorted(batch.choices, key=lambda c: c.index)] == [0, 1]
    assert (
        sorted(batch.choices, key=lambda c: c.index)[0].text
        == (await cluster.client.completions.create(model=cluster.model, prompt=prompt, max_tokens=4, seed=2))
        .choices[0]
        .text
    )

    echo = await cluster.client.completions.create(model=cluster.model, prompt=prompt, max_tokens=3, echo=True, seed=2)
    assert echo.choices[0].text.startswith(prompt) and len(echo.choices[0].text) > len(prompt)


async def test_completions_streaming(cluster: Cluster) -> None:
    full = await cluster.client.completions.create(model=cluster.model, prompt="Hi", max_tokens=25, seed=9)
    stream = await cluster.client.completions.create(
        model=cluster.model,
        prompt="Hi",
        max_tokens=25,
        seed=9,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [c async for c in stream]
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full.choices[0].text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 25


async def test_models_endpoint(cluster: Cluster) -> None:
    models = await cluster.client.models.list()
    assert [m.id for m in models.data] == [cluster.model]


async def test_metrics_count_requests_tokens_and_loop_lag(cluster: Cluster) -> None:
    import aiohttp

    await cluster.client.completions.create(model=cluster.model, prompt="Hi", max_tokens=3)
    async with aiohttp.ClientSession() as session, session.get(cluster.node.url + "/metrics") as resp:
        text = await resp.text()
    assert resp.status == 200
    assert 'smg_node_http_requests_total{route="/v1/completions",status="200"}' in text
    assert "smg_node_event_loop_lag_seconds_bucket" in text
    assert 'smg_node_worker_healthy{worker="grpc://127.0.0.1:' in text
    assert 'smg_node_tokenizer_cache_lookups_total{level="l0",result="miss"}' in text
    completion = next(line for line in text.splitlines() if line.startswith('smg_node_tokens_total{kind="completion"}'))
    assert float(completion.split()[-1]) >= 3
