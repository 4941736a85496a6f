"""Gossip encryption with real nodes: the right key joins, a wrong key or no key stays alone; SIGHUP rotates
the key of a running cluster without downtime."""

from __future__ import annotations

import base64
import os
import signal
from pathlib import Path

from chaos.cluster import Cluster, Node, Profile, alive_names, fetch_view, free_port, loopback_nodes, wait_until

#: How long the outsiders keep trying while we watch: many probe and gossip rounds, and join retries.
WATCH_S = 4.0
#: How long the cluster is watched after each rotation step: ten probe rounds of the 200 ms profile, more than
#: the suspicion a node that cannot read its peers would raise.
STEP_WATCH_S = 2.0
#: A SIGHUP is handled at once; the slack is for two busy cores.
RELOAD_TIMEOUT_S = 10.0


def write_keys(path: Path, *keys: bytes) -> Path:
    """A keyring file as `--mesh-key-file` reads it: one base64 key per line (the first is primary), mode 0600."""
    path.write_text("# chaos test keys\n" + "".join(base64.b64encode(key).decode() + "\n" for key in keys))
    path.chmod(0o600)
    return path


def key_file(path: Path) -> Path:
    """A keyring file holding one fresh random key."""
    return write_keys(path, os.urandom(32))


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


def _log_count(node: Node, needle: str) -> int:
    return node.logs[-1].read_text(errors="replace").count(needle) if node.logs else 0


def _hangup(cluster: Cluster, nodes: list[Node], *, logged: str, what: str) -> None:
    """SIGHUP ``nodes`` and wait until each has logged ``logged`` once more."""
    before = {n.name: _log_count(n, logged) for n in nodes}
    for node in nodes:
        assert node.proc is not None
        os.kill(node.proc.pid, signal.SIGHUP)

    def handled() -> bool:
        for node in nodes:
            if not node.running:
                raise RuntimeError(f"{node.name} exited on SIGHUP:\n{cluster.tail(node)}")
        return all(_log_count(n, logged) > before[n.name] for n in nodes)

    wait_until(handled, timeout_s=RELOAD_TIMEOUT_S, what=what, interval_s=0.1)


def test_sighup_rotates_the_key_of_a_running_cluster_without_downtime(
    model_dir: Path, worker_url: str, profile: Profile, tmp_path: Path
) -> None:
    old, new = os.urandom(32), os.urandom(32)
    port = free_port([f"127.0.0.{k}" for k in range(31, 36)])
    with Cluster(workdir=tmp_path, model_dir=model_dir, worker_url=worker_url, profile=profile) as cluster:
        n1, n2, n3, only_old, only_new = loopback_nodes(5, mesh_port=port, first_host=31)
        members = [n1, n2, n3]
        names = {n.name for n in members}
        for node in members:
            node.key_file = write_keys(tmp_path / f"{node.name}.keys", old)
        only_old.key_file = write_keys(tmp_path / "only-old.keys", old)
        only_new.key_file = write_keys(tmp_path / "only-new.keys", new)
        for node in (n1, n2, n3, only_old, only_new):
            cluster.add(node)
        cluster.start(*members)
        cluster.wait_up(*members)
        cluster.wait_converged(members, timeout_s=30)
        refused = cluster.counters(members, "decrypt_failures")
        deaths = cluster.counters(members, "deaths")

        # The documented procedure, each step on every node before the next: add the new key, make it the
        # primary, drop the old one. Every node can read what every other writes at every moment.
        for step, keys in (("add the new key", (old, new)), ("switch", (new, old)), ("drop the old", (new,))):
            for node in members:
                assert node.key_file is not None
                write_keys(node.key_file, *keys)
            _hangup(cluster, members, logged="reloaded:", what=f"every node to reload its key file ({step})")
            bad = cluster.watch(members, STEP_WATCH_S, ["suspect", "dead", "left"])
            assert not bad, f"after '{step}': {bad}"
            assert cluster.converged(members, names), f"after '{step}': {cluster.describe(members)}"
        # Not one packet or frame between members failed to decrypt, and no one was declared dead.
        assert cluster.counters(members, "decrypt_failures") == refused
        assert cluster.counters(members, "deaths") == deaths

        # A bad key file is logged and changes nothing (n1 still reads and writes the new key below).
        assert n1.key_file is not None
        n1.key_file.write_text("not a key\n")
        _hangup(cluster, [n1], logged="keyring unchanged", what="n1 to refuse its bad key file")

        # Only the new key opens the cluster now; n1 (the seed of both) keeps the key it had.
        cluster.start(only_old, only_new)
        cluster.wait_up(only_old, only_new)
        cluster.wait_converged([*members, only_new], timeout_s=30)
        wait_until(
            lambda: "join attempt" in cluster.tail(only_old, lines=200),
            timeout_s=30,
            what="the old key's failed join attempts",
            interval_s=0.2,
        )
        listed = cluster.listed([*members, only_old], WATCH_S)
        assert listed[only_old.name] == {only_old.name}, listed
        assert all(only_old.name not in listed[n.name] for n in members), listed
