"""--mesh-role: the labels a node publishes in its member metadata, and how `smg-node members` lists them."""

from __future__ import annotations

import pytest

from node import configload
from node.cli import _roles_text, build_parser, load_node_config
from node.cluster.config import ClusterConfig, node_meta


def test_mesh_role_flags_become_the_published_role_map() -> None:
    args = build_parser().parse_args(
        [
            "serve",
            "--model-path",
            "/m",
            "--mesh-bind",
            "127.0.0.1:0",
            "--mesh-role",
            "zone=eu-1",
            "--mesh-role",
            "prefill",
        ]
    )
    config = load_node_config(args).cluster
    assert config.mesh_roles == ("zone=eu-1", "prefill")
    meta = node_meta(config, "127.0.0.1:8000")
    assert (meta.http_addr, meta.roles_dict) == ("127.0.0.1:8000", {"zone": "eu-1", "prefill": ""})
    assert _roles_text(meta.roles_dict) == "zone=eu-1,prefill"
    assert node_meta(ClusterConfig(), "h:1").roles == ()


@pytest.mark.parametrize(
    ("roles", "needle"),
    [(("=a",), "KEY=VALUE"), (("zone=a", "zone=b"), "twice"), (tuple(f"r{k}" for k in range(17)), "roles")],
)
def test_bad_roles_are_refused_at_load(monkeypatch: pytest.MonkeyPatch, roles: tuple[str, ...], needle: str) -> None:
    monkeypatch.setenv("SMG_NODE_MESH_ROLES", ",".join(roles))
    with pytest.raises(configload.ConfigError, match=f"mesh_roles.*{needle}"):
        load_node_config(build_parser().parse_args(["serve", "--model-path", "/m"]))


def test_members_table_shows_roles_only_when_some_member_has_them(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import node.cli as cli

    row = {"mesh_addr": "127.0.0.1:7946", "http_addr": "", "state": "alive", "incarnation": 1, "since_change_s": 2}
    plain = {"members": [{**row, "name": "a", "roles": {}}]}
    labelled = {"members": [{**row, "name": "a", "roles": {}}, {**row, "name": "b", "roles": {"zone": "x", "gpu": ""}}]}
    args = build_parser().parse_args(["members"])
    for body in (plain, labelled):
        monkeypatch.setattr(cli, "_node_request", lambda *_a, body=body, **_k: body)
        assert cli.cmd_members(args) == 0
    without, with_roles = capsys.readouterr().out.split("NAME")[1:]
    assert "ROLES" not in without
    assert with_roles.splitlines()[0].split()[-1] == "ROLES"
    assert with_roles.splitlines()[2].endswith("zone=x,gpu")
