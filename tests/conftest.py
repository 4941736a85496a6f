"""Fixtures shared across the test suite."""

from __future__ import annotations

import os

# gRPC's fork support restarts its poller in the child of every subprocess.Popen (before exec), where the
# poller's epoll fd is already closed: the child aborts with EBADF (grpc/grpc#43157). Nothing here uses gRPC
# across a fork, so turn it off before grpc is imported.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from pathlib import Path

import pytest

from node.models.prepare import prepare_model
from node.pipeline.tokenizer import Tokenizer

# --- real model folders (assembled from the installed tokenizer packages, once per session) ---


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def llama3_model_dir(models_dir: Path) -> Path:
    return prepare_model("llama3", models_dir)


@pytest.fixture(scope="session")
def deepseek_model_dir(models_dir: Path) -> Path:
    return prepare_model("deepseek", models_dir)


@pytest.fixture(scope="session")
def qwen_model_dir(models_dir: Path) -> Path:
    return prepare_model("qwen", models_dir)


# Loading a 128k-entry tokenizer takes ~0.3 s: share one per session.
@pytest.fixture(scope="session")
def llama3_tokenizer(llama3_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(llama3_model_dir)


@pytest.fixture(scope="session")
def deepseek_tokenizer(deepseek_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(deepseek_model_dir)


@pytest.fixture(scope="session")
def qwen_tokenizer(qwen_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(qwen_model_dir)


# The same vocabularies through tiktoken rather than the native encoder (what deployments without a C
# compiler at install run): the fast-path tests cover both.
@pytest.fixture(scope="session")
def llama3_tiktoken(llama3_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(llama3_model_dir, native=False)


@pytest.fixture(scope="session")
def qwen_tiktoken(qwen_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(qwen_model_dir, native=False)
