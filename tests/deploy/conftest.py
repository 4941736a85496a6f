"""The docker tier: opt-in (`scripts/check --docker`, or SMG_NODE_DOCKER_TESTS=1), run by CI.

One compose cluster per session, under a private dockerd that is stopped and cleaned up afterwards, whatever
happens in between."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator

import pytest

from tests.deploy.cluster import Cluster
from tests.deploy.dockerd import DockerUnavailable, private_dockerd
from tests.procs import free_port, wait_until

ENABLE_VAR = "SMG_NODE_DOCKER_TESTS"
UP_TIMEOUT_S = 240.0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(ENABLE_VAR) == "1":
        return
    skip = pytest.mark.skip(reason=f"docker tier: run scripts/check --docker or set {ENABLE_VAR}=1")
    for item in items:
        if "docker" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    try:
        daemon_cm = private_dockerd()
        daemon = daemon_cm.__enter__()
    except DockerUnavailable as exc:
        pytest.skip(str(exc))
    try:
        cluster = Cluster(daemon=daemon, project=f"smgtest{os.getpid()}", port=free_port())
        cluster.build()
        started = time.monotonic()
        try:
            cluster.compose("up", "-d")
            wait_until(cluster.meshed, timeout_s=UP_TIMEOUT_S, what="3 healthy meshed nodes", interval_s=1)
            wait_until(lambda: _ready(cluster), timeout_s=30, what="the entry point", interval_s=0.5)
            cluster.timings["compose up to meshed"] = time.monotonic() - started
            yield cluster
        finally:
            print(f"\n[docker tier] timings: {cluster.timings}", file=sys.stderr)
            try:
                cluster.compose("logs", "--no-color", "--tail", "30")
            except Exception:
                pass
            cluster.compose("down", "-v", "--timeout", "5")
    finally:
        daemon_cm.__exit__(None, None, None)


def _ready(cluster: Cluster) -> bool:
    from tests.deploy.cluster import status

    return status(cluster.url + "/readiness") == 200
