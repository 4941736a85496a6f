"""The load generator's Anthropic Messages client against a real node (in-memory worker, loopback)."""

from __future__ import annotations

from pathlib import Path

from bench import load
from node.pipeline.served_model import load_served_model
from tests.http.test_agentic import serve


async def test_a_messages_stream_is_read_from_a_real_node(llama3_model_dir: Path) -> None:
    """The Anthropic Messages load reads TTFT and the token counts from the node's own stream."""
    model = load_served_model(str(llama3_model_dir), served_name="llama3")
    async with serve(model, cached_tokens=4) as edge:
        edge.answer[0] = "one two three four five six"
        body = load.messages_body("llama3", "Hello there", 3)
        sample = await load.stream_messages(edge.http, f"{edge.url}/v1/messages", body)
    assert sample.completion_tokens == 3 and sample.cached_tokens == 4
    assert sample.prompt_tokens == len(edge.worker.requests[-1].prompt_ids)
    assert 0 < sample.ttft_s <= sample.latency_s
