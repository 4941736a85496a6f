"""node/cluster/keys.py: SIGHUP's key file reload into the live keyring (key rotation without a restart)."""

from __future__ import annotations

import base64
import logging
from pathlib import Path

import pytest

from mesh.config import MeshConfig
from mesh.errors import KeyringError
from mesh.keyring import Keyring
from mesh.runtime import Mesh
from node.cluster.keys import KeyFileReload, apply_keys, reload_key_file

A, B, C = bytes([1]) * 32, bytes([2]) * 32, bytes([3]) * 16
CONFIG = MeshConfig.local(bind_addr="127.0.0.1", bind_port=0, node_name="m")


def _write(path: Path, *keys: bytes) -> str:
    path.write_text("# rotation\n" + "".join(base64.b64encode(k).decode() + "\n" for k in keys))
    return str(path)


def test_apply_keys_adds_switches_the_primary_and_removes_the_rest() -> None:
    ring = Keyring([A, C])
    assert apply_keys(ring, [B, A]) == (1, 1)
    assert ring.keys == (B, A)
    assert apply_keys(ring, [B]) == (0, 1)
    assert list(ring.keys) == [B]
    assert apply_keys(ring, [B]) == (0, 0)
    with pytest.raises(KeyringError):
        apply_keys(ring, [])
    assert list(ring.keys) == [B]


async def test_reload_rotates_the_live_keyring_and_a_bad_file_changes_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "mesh.keys"
    async with Mesh(CONFIG, keyring=Keyring([A])) as mesh:
        ring = mesh.keyring
        assert ring is not None
        steps = [((A, B), (A, B)), ((B, A), (B, A)), ((B,), (B,))]  # add B; make it primary; drop A
        for written, expected in steps:
            assert reload_key_file(mesh, _write(path, *written))
            assert ring.keys == expected
        caplog.set_level(logging.ERROR, logger="node.cluster.keys")
        path.write_text("not base64!\n")
        assert not reload_key_file(mesh, str(path))
        assert not reload_key_file(mesh, str(tmp_path / "missing.keys"))
        _write(path)  # comments only: no key at all
        assert not reload_key_file(mesh, str(path))
        assert list(ring.keys) == [B]
        assert ["keyring unchanged" in r.getMessage() for r in caplog.records] == [True] * 3


async def test_reload_without_encryption_is_refused(tmp_path: Path) -> None:
    async with Mesh(CONFIG) as mesh:
        assert not reload_key_file(mesh, _write(tmp_path / "mesh.keys", A))
        assert mesh.keyring is None


async def test_the_sighup_action_reloads_only_while_the_node_serves(tmp_path: Path) -> None:
    hangup = KeyFileReload(_write(tmp_path / "mesh.keys", B, A))
    async with Mesh(CONFIG, keyring=Keyring([A])) as mesh:
        hangup()  # before it serves: ignored (the default action would end the process)
        assert mesh.keyring is not None and mesh.keyring.keys == (A,)
        with hangup.serving(mesh):
            hangup()
            assert list(mesh.keyring.keys) == [B, A]
        _write(tmp_path / "mesh.keys", B)
        hangup()  # shutting down: ignored again
        assert list(mesh.keyring.keys) == [B, A]
