"""The node's mesh config: seeds under --processes (every sibling finds the others, whichever of them restarts),
and the addresses and protection a mesh may run with."""

from __future__ import annotations

import pytest

from node.cluster.config import ClusterConfig, mesh_config, seeds


def test_every_sibling_joins_all_the_others_and_the_configured_peers() -> None:
    base = {"mesh_bind": "127.0.0.1:7000", "join": ("10.0.0.9:7946",), "process_count": 3}
    assert seeds(ClusterConfig(**base, process_index=0)) == ["10.0.0.9:7946", "127.0.0.1:7001", "127.0.0.1:7002"]
    assert seeds(ClusterConfig(**base, process_index=2)) == ["10.0.0.9:7946", "127.0.0.1:7000", "127.0.0.1:7001"]
    assert mesh_config(ClusterConfig(**base, process_index=2)).bind_port == 7002


def test_siblings_are_reached_at_the_advertised_address() -> None:
    config = ClusterConfig(
        mesh_bind="0.0.0.0:7000", mesh_advertise="10.1.2.3:8000", process_count=2, mesh_insecure=True
    )
    assert seeds(config) == ["10.1.2.3:8001"]


def test_one_process_or_an_unknown_port_adds_no_sibling() -> None:
    assert seeds(ClusterConfig(mesh_bind="127.0.0.1:7000", join=("127.0.0.1:7946",))) == ["127.0.0.1:7946"]
    assert seeds(ClusterConfig(mesh_bind="127.0.0.1:0", process_count=2)) == []
    assert seeds(ClusterConfig()) == []


def test_a_keyless_mesh_reachable_from_other_hosts_needs_mesh_insecure() -> None:
    for bind in ("0.0.0.0:7946", "10.0.0.5:7946", "[fe80::1]:7946"):
        extra = {"mesh_advertise": "10.0.0.5:7946"} if bind.startswith("0.0.0.0") else {}
        with pytest.raises(ValueError, match=r"mesh_insecure: .*--mesh-key-file.*--mesh-insecure"):
            ClusterConfig(mesh_bind=bind, **extra)
        with pytest.raises(ValueError, match="UDP gossip"):  # mutual TLS alone leaves UDP forgeable
            ClusterConfig(mesh_bind=bind, mesh_tls_cert="c", mesh_tls_key="k", mesh_tls_ca="a", **extra)
        assert ClusterConfig(mesh_bind=bind, mesh_insecure=True, **extra).unprotected
        assert not ClusterConfig(mesh_bind=bind, mesh_key_file="/etc/smg/mesh.keys", **extra).unprotected
    for bind in ("127.0.0.1:7946", "127.0.0.42:0", "[::1]:7946"):  # loopback: tests and demos need no key
        assert not ClusterConfig(mesh_bind=bind).unprotected


def test_the_advertised_mesh_address_is_a_literal_ip() -> None:
    with pytest.raises(ValueError, match=r"mesh_advertise: .*literal IP"):
        ClusterConfig(mesh_bind="0.0.0.0:7946", mesh_advertise="gw-1.internal:7946", mesh_insecure=True)
    with pytest.raises(ValueError, match=r"mesh_bind: .*literal IP"):
        ClusterConfig(mesh_bind="localhost:7946")
    assert ClusterConfig(mesh_bind="127.0.0.1:7000", join=("seed.internal:7946",)).join  # seeds may be names
