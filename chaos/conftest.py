"""Fixtures of the chaos suite: one model folder and one simulated worker per session, the mesh profile.

tests/conftest.py does not apply here (pytest applies a conftest to its own directory only), so the model
folder is prepared again, once per session.
"""

from __future__ import annotations

import os

# gRPC's fork support restarts its poller in the child of every subprocess.Popen (before exec), where the
# poller's epoll fd is already closed: the child aborts with EBADF (grpc/grpc#43157). Nothing here uses gRPC
# across a fork, so turn it off before grpc is imported.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos.cluster import FAST_PROFILE, Profile, sim_worker
from node.models.prepare import prepare_model


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return prepare_model("llama3", tmp_path_factory.mktemp("chaos-models"))


@pytest.fixture(scope="session")
def worker_url(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One simulated worker shared by every node: the mesh does not depend on it."""
    with sim_worker(model_dir, tmp_path_factory.mktemp("chaos-worker") / "sim.log") as url:
        yield url


@pytest.fixture(scope="session")
def profile() -> Profile:
    return FAST_PROFILE
