"""Gossip encryption: key rotation without loss, and a node without the key can neither join nor inject."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from mesh.codec import encode_message, seal_packet
from mesh.config import MeshConfig
from mesh.errors import DecryptError, KeyringError
from mesh.keyring import Keyring
from mesh.member import MemberState, NodeMeta
from mesh.messages import Alive, Dead, Suspect
from mesh.sim import SimNetwork, SimNode

OLD, NEW, OTHER = bytes([1]) * 32, bytes([2]) * 16, bytes([3]) * 24
CONFIG = MeshConfig.lan()


def test_seal_and_open_with_rotation_steps() -> None:
    writer, reader = Keyring([OLD]), Keyring([OLD])
    sealed = writer.seal(b"hello", b"aad")
    assert reader.open(sealed, b"aad") == b"hello"
    with pytest.raises(DecryptError):
        reader.open(sealed, b"other aad")
    reader.add(NEW)
    writer.add(NEW)
    writer.use(NEW)
    assert writer.primary == NEW and set(writer.keys) == {OLD, NEW}
    assert reader.open(writer.seal(b"x", b""), b"") == b"x"  # reader still primary OLD, decrypts NEW
    writer.remove(OLD)
    with pytest.raises(DecryptError):
        Keyring([OLD]).open(writer.seal(b"x", b""), b"")


def test_rotation_misuse_is_refused() -> None:
    ring = Keyring([OLD])
    with pytest.raises(KeyringError, match="primary"):
        ring.remove(OLD)
    with pytest.raises(KeyringError, match="not installed"):
        ring.use(NEW)
    with pytest.raises(KeyringError, match="16, 24 or 32"):
        ring.add(b"short")
    with pytest.raises(KeyringError, match="at least one"):
        Keyring([])


def test_key_file_format(tmp_path: Path) -> None:
    text = "# rotated 2026-01\n\n" + base64.b64encode(NEW).decode() + "\n" + base64.b64encode(OLD).decode() + "\n"
    path = tmp_path / "mesh.keys"
    path.write_text(text)
    ring = Keyring.load(path)
    assert ring.keys == (NEW, OLD)
    assert Keyring.parse(ring.dump()).keys == ring.keys
    with pytest.raises(KeyringError, match="line 2: not base64"):
        Keyring.parse(base64.b64encode(OLD).decode() + "\n!!!\n")
    with pytest.raises(KeyringError, match="line 1: key: must be 16"):
        Keyring.parse(base64.b64encode(b"0123456789").decode())
    with pytest.raises(KeyringError, match="key file"):
        Keyring.load(tmp_path / "missing")
    assert len(Keyring.generate()) == 32


def _cluster(net: SimNetwork, n: int, key: bytes) -> list[SimNode]:
    nodes = [net.add_node(CONFIG, keyring=Keyring([key]))]
    for _ in range(n - 1):
        node = net.add_node(CONFIG, keyring=Keyring([key]))
        net.join(node, [nodes[0]])
        nodes.append(node)
    net.run_for(10)
    assert net.converged()
    return nodes


def test_rolling_key_rotation_loses_no_message() -> None:
    net = SimNetwork(7)
    nodes = _cluster(net, 5, OLD)
    rings = {n.name: n.swim.keyring for n in nodes}
    # Each step rolls through the nodes one at a time, with traffic flowing in between.
    for step in ("add", "use", "remove"):
        for node in nodes:
            ring = rings[node.name]
            assert ring is not None
            if step == "add":
                ring.add(NEW)
            elif step == "use":
                ring.use(NEW)
            else:
                ring.remove(OLD)
            net.run_for(3.0)
    net.run_for(30)
    for node in nodes:
        m = node.swim.metrics()
        assert m.decrypt_failures == 0 and m.suspicions == 0 and m.probes_failed == 0, node.name
        assert rings[node.name].keys == (NEW,)  # type: ignore[union-attr]
    assert net.converged()


def test_a_node_without_the_key_cannot_join() -> None:
    net = SimNetwork(8)
    nodes = _cluster(net, 3, OLD)
    stranger = net.add_node(CONFIG, "stranger", keyring=Keyring([OTHER]))
    net.join(stranger, [nodes[0]])
    plain = net.add_node(CONFIG, "plain")  # no keyring at all
    net.join(plain, [nodes[0]])
    net.run_for(60)
    for node in nodes:
        assert node.swim.member("stranger") is None and node.swim.member("plain") is None
        assert len(node.view()) == 3
    assert {m.name for m in stranger.swim.members()} == {"stranger"}
    assert nodes[0].swim.metrics().decrypt_failures >= 2
    assert stranger.swim.metrics().streams_failed >= 1


def test_a_node_without_the_key_cannot_inject_state() -> None:
    net = SimNetwork(9)
    nodes = _cluster(net, 3, OLD)
    victim = nodes[1]
    forged: list[Alive | Suspect | Dead] = [
        Alive(99, "ghost", "10.9.9.9:7946", NodeMeta()),
        Suspect(victim.swim.incarnation + 5, victim.name, "attacker"),
        Dead(victim.swim.incarnation + 5, victim.name, "attacker"),
    ]
    for key in (OTHER, None):
        ring = Keyring([key]) if key else None
        for msg in forged:
            for target in nodes:
                net.inject(target, seal_packet(encode_message(msg), ring), "10.9.9.9:7946")
    net.run_for(5)
    for node in nodes:
        assert node.swim.member("ghost") is None
        assert node.swim.member(victim.name).state == MemberState.ALIVE  # type: ignore[union-attr]
        assert node.swim.metrics().decrypt_failures >= 6
    assert victim.swim.metrics().refutations == 0
