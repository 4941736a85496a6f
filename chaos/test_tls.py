"""Mutual TLS on mesh streams with real nodes: certificates of the cluster CA join, another CA's stays out."""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path

from chaos.cluster import Cluster, Node, Profile, alive_names, fetch_view, free_port, loopback_nodes, wait_until
from tests.mesh.tls_certs import CertAuthority

#: How long the outsider keeps trying while we watch: many probe and gossip rounds, and join retries.
WATCH_S = 4.0


def _use(node: Node, ca: CertAuthority) -> None:
    files = ca.issue(node.name)
    node.tls = (files.cert, files.key, files.ca)


def test_only_nodes_with_a_cert_of_the_cluster_ca_join(
    model_dir: Path, worker_url: str, profile: Profile, tmp_path: Path
) -> None:
    cluster_ca, other_ca = CertAuthority(tmp_path, "cluster"), CertAuthority(tmp_path, "other")
    port = free_port([f"127.0.0.{k}" for k in range(31, 35)])
    with Cluster(workdir=tmp_path, model_dir=model_dir, worker_url=worker_url, profile=profile) as cluster:
        n1, n2, n3, n4 = loopback_nodes(4, mesh_port=port, first_host=31)
        for node in (n1, n2, n3):
            _use(node, cluster_ca)
        _use(n4, other_ca)
        for node in (n1, n2, n3, n4):
            cluster.add(node)
        cluster.start(n1, n2, n3, n4)
        cluster.wait_up(n1, n2, n3, n4)
        cluster.wait_converged([n1, n2, n3], timeout_s=30)

        # The outsider did try to join (and failed at least once); meanwhile nobody lets it in.
        wait_until(
            lambda: "join attempt" in cluster.tail(n4, lines=200),
            timeout_s=30,
            what="the outsider's failed join attempts",
            interval_s=0.2,
        )
        listed = cluster.listed([n1, n2, n3, n4], WATCH_S)
        insiders = {"n1", "n2", "n3"}
        assert listed == {"n1": insiders, "n2": insiders, "n3": insiders, "n4": {"n4"}}, listed
        assert alive_names(fetch_view(n1.url) or {}) == insiders
        # n4 refuses the seed's certificate before presenting its own (TLS 1.3), so the refusal is counted
        # on n4's side; the seed refuses a plaintext frame itself. Among the insiders not one failed.
        with socket.create_connection((n1.mesh_host, n1.mesh_port), timeout=5) as plain:
            plain.sendall(bytes([1, 1, 0, 0, 0, 0]))  # a stream frame header (version 1), no TLS
            answer = b""
            with contextlib.suppress(OSError):  # a reset is as good as a close
                answer = plain.recv(64)
            assert not answer.startswith(b"\x01"), f"the seed answered a plaintext stream: {answer!r}"
        wait_until(
            lambda: cluster.counters([n1], "tls_handshake_failures")["n1"] > 0,
            timeout_s=10,
            what="the seed to count the refused plaintext stream",
        )
        failures = cluster.counters([n1, n2, n3, n4], "tls_handshake_failures")
        assert failures["n4"] > 0 and failures["n2"] == failures["n3"] == 0, failures
