"""The node's mesh seeds under --processes: every sibling finds the others, whichever of them restarts."""

from __future__ import annotations

from node.cluster.config import ClusterConfig, mesh_config, seeds


def test_every_sibling_joins_all_the_others_and_the_configured_peers() -> None:
    base = {"mesh_bind": "127.0.0.1:7000", "join": ("10.0.0.9:7946",), "process_count": 3}
    assert seeds(ClusterConfig(**base, process_index=0)) == ["10.0.0.9:7946", "127.0.0.1:7001", "127.0.0.1:7002"]
    assert seeds(ClusterConfig(**base, process_index=2)) == ["10.0.0.9:7946", "127.0.0.1:7000", "127.0.0.1:7001"]
    assert mesh_config(ClusterConfig(**base, process_index=2)).bind_port == 7002


def test_siblings_are_reached_at_the_advertised_address() -> None:
    config = ClusterConfig(mesh_bind="0.0.0.0:7000", mesh_advertise="10.1.2.3:8000", process_count=2)
    assert seeds(config) == ["10.1.2.3:8001"]


def test_one_process_or_an_unknown_port_adds_no_sibling() -> None:
    assert seeds(ClusterConfig(mesh_bind="127.0.0.1:7000", join=("127.0.0.1:7946",))) == ["127.0.0.1:7946"]
    assert seeds(ClusterConfig(mesh_bind="127.0.0.1:0", process_count=2)) == []
    assert seeds(ClusterConfig()) == []
