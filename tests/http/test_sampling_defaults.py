"""A request that leaves sampling knobs unset gets the model's generation_config values, as vLLM does."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import msgspec

from node.http.openai_chat import chat_request
from node.http.openai_types import ChatCompletionRequest
from node.pipeline.prepare import sampling_params
from node.pipeline.request import Sampling
from node.pipeline.served_model import load_served_model


def _req(**kw: object) -> Sampling:
    """The neutral sampling fields the chat adapter makes of a request with ``kw``."""
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], **kw}
    return chat_request(msgspec.json.decode(msgspec.json.encode(body), type=ChatCompletionRequest)).sampling


def test_generation_config_defaults_apply_only_when_unset(llama3_model_dir: Path) -> None:
    model = load_served_model(str(llama3_model_dir), served_name="m")
    assert model.sampling_defaults == {"temperature": 0.6, "top_p": 0.9}
    p = sampling_params(_req(), model, max_tokens=5)
    assert (p.temperature, p.top_p, p.top_k, p.repetition_penalty) == (0.6, 0.9, 0, 1.0)
    p = sampling_params(_req(temperature=0, top_p=1, top_k=-1, seed=2**40 + 3), model, max_tokens=5)
    assert (p.temperature, p.top_p, p.top_k) == (0.0, 1.0, 0)
    assert p.seed is not None and 0 <= p.seed < 2**31, "a 64-bit seed folds into the contract's int32"
    bare = dataclasses.replace(model, sampling_defaults={})
    assert sampling_params(_req(), bare, max_tokens=5).temperature is None
