"""Gossip encryption with real nodes: the right key joins, a wrong key or no key stays alone."""

from __future__ import annotations

import base64
import os
from pathlib import Path

from chaos.cluster import Cluster, Profile, alive_names, fetch_view, free_port, loopback_nodes, wait_until

#: How long the outsiders keep trying while we watch: many probe and gossip rounds, and join retries.
WATCH_S = 4.0


def key_file(path: Path) -> Path:
    """A keyring file as `--mesh-key-file` reads it: one base64 key per line, mode 0600."""
    path.write_text(f"# chaos test key\n{base64.b64encode(os.urandom(32)).decode()}\n")
    path.chmod(0o600)
    return path


def test_only_a_node_with_the_right_key_joins(
    model_dir: Path, worker_url: str, profile: Profile, tmp_path: Path
) -> None:
    right, wrong = key_file(tmp_path / "right.keys"), key_file(tmp_path / "wrong.keys")
    port = free_port([f"127.0.0.{k}" for k in range(21, 25)])
    with Cluster(workdir=tmp_path, model_dir=model_dir, worker_url=worker_url, profile=profile) as cluster:
        n1, n2, n3, n4 = loopback_nodes(4, mesh_port=port, first_host=21)
        n1.key_file = n2.key_file = right
        n3.key_file = wrong  # n4: no key at all
        for node in (n1, n2, n3, n4):
            cluster.add(node)
        cluster.start(n1, n2, n3, n4)
        cluster.wait_up(n1, n2, n3, n4)
        cluster.wait_converged([n1, n2], timeout_s=30)

        def outsiders_tried() -> bool:
            return all("join attempt" in cluster.tail(n, lines=200) for n in (n3, n4))

        # Both outsiders did try to join (and failed at least once); meanwhile nobody lets them in.
        wait_until(outsiders_tried, timeout_s=30, what="the outsiders' failed join attempts", interval_s=0.2)
        listed = cluster.listed([n1, n2, n3, n4], WATCH_S)
        want = {"n1": {"n1", "n2"}, "n2": {"n1", "n2"}, "n3": {"n3"}, "n4": {"n4"}}
        assert listed == want, f"members listed at least once over {WATCH_S} s: {listed}"
        assert alive_names(fetch_view(n1.url) or {}) == {"n1", "n2"}
        # The seed did receive the outsiders' packets and frames, and refused them.
        refused = cluster.counters([n1], "decrypt_failures")["n1"] + cluster.counters([n1], "malformed_packets")["n1"]
        assert refused > 0, "the seed never saw (and refused) the outsiders' traffic"
