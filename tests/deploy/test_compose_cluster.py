"""deploy/compose for real: the image built from this tree, 3 meshed nodes behind HAProxy, simulated workers and
Redis history; a node killed and restarted, then every node restarted in turn, all under steady traffic."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from tests.deploy.cluster import Cluster, Load, get_json, status, store_response, stream
from tests.procs import wait_until

pytestmark = [pytest.mark.docker, pytest.mark.timeout(2400)]

REJOIN_TIMEOUT_S = 120.0
STREAM_TOKENS = 1200  # at the compose workers' 5 ms per token: ~6 s, spanning the kill and the restart


def _report(line: str) -> None:
    print(f"\n[docker tier] {line}", file=sys.stderr)


def test_cluster_serves_through_the_entry_point(cluster: Cluster) -> None:
    assert len(cluster.containers("node")) == 3
    members = get_json(cluster.url + "/mesh/members")["members"]
    assert isinstance(members, list) and len(members) == 3
    assert stream(cluster.url, 16) == 16


def test_kill_a_node_and_restart_it(cluster: Cluster) -> None:
    stored = [store_response(cluster.url) for _ in range(6)]
    victim, *others = cluster.containers("node")
    # Streams straight to the other nodes (not through the balancer): a node dying must not touch them.
    results: dict[str, object] = {}

    def run_stream(container: str) -> None:
        try:
            results[container] = stream(cluster.node_url(container), STREAM_TOKENS)
        except Exception as exc:
            results[container] = exc

    streams = [threading.Thread(target=run_stream, args=(c,)) for c in others]
    with Load(cluster.url) as load:
        for thread in streams:
            thread.start()
        time.sleep(1.5)
        cluster.run(["docker", "kill", victim])
        killed = time.monotonic()
        time.sleep(2)
        cluster.run(["docker", "start", victim])
        wait_until(cluster.meshed, timeout_s=REJOIN_TIMEOUT_S, what="the node to rejoin", interval_s=0.5)
        rejoined = time.monotonic() - killed
        time.sleep(2)  # traffic on the restored cluster too
    for thread in streams:
        thread.join(60)
    _report(f"kill/restart: {load.ok} requests ok, {len(load.failures)} failed; rejoined {rejoined:.1f} s after kill")
    assert not load.failures, load.failures[:5]
    assert load.ok > 20
    for container in others:
        got = results[container]
        assert isinstance(got, int) and got >= STREAM_TOKENS, f"stream on {container}: {got!r}"
    for response_id in stored:
        assert status(f"{cluster.url}/v1/responses/{response_id}") == 200, f"stored {response_id} lost"
    assert status(cluster.node_url(victim) + "/readiness") == 200


def test_rolling_restart_under_load_fails_nothing(cluster: Cluster) -> None:
    started = time.monotonic()
    with Load(cluster.url, stream_every=4) as load:
        time.sleep(1)
        for container in cluster.containers("node"):
            cluster.run(["docker", "restart", "-t", "40", container], timeout_s=120)  # SIGTERM: drain, exit 0
            wait_until(cluster.meshed, timeout_s=REJOIN_TIMEOUT_S, what=f"{container} back", interval_s=0.5)
        time.sleep(1)
    took = time.monotonic() - started
    _report(f"rolling restart of 3 nodes in {took:.0f} s: {load.ok} requests ok, {len(load.failures)} failed")
    assert not load.failures, load.failures[:5]
    assert load.ok > 50
