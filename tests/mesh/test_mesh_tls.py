"""Mutual TLS on the mesh's TCP streams: real `Mesh` members on 127.0.0.1 with certificates made per test.

Members of one CA join and converge (with and without a keyring inside, on asyncio and uvloop); a member
whose certificate comes from another CA, a member without TLS, and a TLS client without a certificate get
no state in or out, and the refused handshakes are counted. Waits poll with generous timeouts (see
test_mesh_runtime.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import uvloop
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from mesh import JoinError, Keyring, MemberState, Mesh, MeshConfig, TlsError
from mesh.limits import MAX_INBOUND_STREAMS, MAX_INBOUND_STREAMS_PER_HOST, TLS_HANDSHAKE_TIMEOUT_S
from mesh.tls import TlsContexts
from tests.mesh.test_mesh_runtime import CONFIG, Recorder, eventually, states
from tests.mesh.tls_certs import CertAuthority, TlsFiles

OUTSIDER_CONFIG = CONFIG.with_(join_timeout_s=0.5)


def _config(name: str, files: TlsFiles | None, base: MeshConfig = CONFIG) -> MeshConfig:
    return base.with_(node_name=name, **(files.mesh_fields() if files else {}))


@pytest.mark.parametrize("with_keyring", [False, True], ids=["tls", "tls+keyring"])
async def test_members_of_one_ca_join_and_converge(tmp_path: Path, with_keyring: bool) -> None:
    await _members_of_one_ca_join(tmp_path, with_keyring)


async def test_a_member_of_another_ca_or_without_tls_cannot_join(tmp_path: Path) -> None:
    await _outsiders_stay_out(tmp_path)


def test_the_same_on_uvloop(tmp_path: Path) -> None:
    """The node runs the mesh on uvloop, whose transports and TLS are its own."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    uvloop.run(_members_of_one_ca_join(tmp_path / "a", with_keyring=True))
    uvloop.run(_outsiders_stay_out(tmp_path / "b"))


async def _members_of_one_ca_join(tmp_path: Path, with_keyring: bool) -> None:
    ca = CertAuthority(tmp_path, "cluster")
    files = [ca.issue(f"m{k}") for k in range(3)]
    # m0 trusts two CAs, as every member does in the middle of a CA rotation.
    bundle = tmp_path / "bundle.crt"
    bundle.write_bytes(CertAuthority(tmp_path, "next").cert_file.read_bytes() + ca.cert_file.read_bytes())
    files[0] = TlsFiles(cert=files[0].cert, key=files[0].key, ca=bundle)
    key = Keyring.generate()
    apps = [Recorder() for _ in range(3)]
    async with AsyncExitStack() as stack:
        members = []
        for k, app in enumerate(apps):
            keyring = Keyring([key]) if with_keyring else None
            mesh = Mesh(_config(f"m{k}", files[k]), delegate=app, keyring=keyring)
            members.append(await stack.enter_async_context(mesh))
        seed, b, c = members
        assert await b.join([seed.addr]) == 1
        assert await c.join([seed.addr]) == 1
        everyone = dict.fromkeys(("m0", "m1", "m2"), MemberState.ALIVE)
        await eventually(lambda: all(states(m) == everyone for m in members))
        # The joins' push-pulls carried the delegates' state both ways, over TLS.
        assert (b"state-of-join", True) in apps[0].state_in and (b"state-of-join", True) in apps[1].state_in
        for mesh in members:
            metrics = mesh.metrics()
            assert metrics.tls_handshake_failures == 0 and metrics.malformed_packets == 0, mesh.name
            assert metrics.decrypt_failures == 0, mesh.name


async def _outsiders_stay_out(tmp_path: Path) -> None:
    """eve: a certificate of another CA; mallory: one of another CA but the cluster's CA certificate (it
    is public); plain: no TLS at all. Each refusal is counted by the side that refuses."""
    cluster, other = CertAuthority(tmp_path, "cluster"), CertAuthority(tmp_path, "other")
    mallory = other.issue("mallory")
    stolen_ca = TlsFiles(cert=mallory.cert, key=mallory.key, ca=cluster.cert_file)
    app = Recorder()
    async with AsyncExitStack() as stack:
        seed = await stack.enter_async_context(Mesh(_config("seed", cluster.issue("seed")), delegate=app))
        member = await stack.enter_async_context(Mesh(_config("member", cluster.issue("member")), delegate=Recorder()))
        outsiders = {
            "eve": other.issue("eve"),
            "mallory": stolen_ca,
            "plain": None,
        }
        refused_by_seed = {}
        for name, files in outsiders.items():
            outsider = await stack.enter_async_context(Mesh(_config(name, files, OUTSIDER_CONFIG)))
            before = seed.metrics().tls_handshake_failures
            with pytest.raises(JoinError):
                await outsider.join([seed.addr])
            refused_by_seed[name] = seed.metrics().tls_handshake_failures - before
            assert states(outsider) == {name: MemberState.ALIVE}
            if name == "eve":  # she refuses the seed's certificate before presenting hers (TLS 1.3)
                assert outsider.metrics().tls_handshake_failures > 0
        # The seed refused every attempt of mallory's (no certificate it trusts) and plain's (no TLS).
        assert refused_by_seed["mallory"] > 0 and refused_by_seed["plain"] > 0, refused_by_seed
        await member.join([seed.addr])
        for name in outsiders:
            assert name not in states(seed) and name not in states(member)
        # Nothing of theirs (no delegate: empty state) reached the seed's application; member's did.
        assert (b"state-of-join", True) in app.state_in
        assert set(app.state_in) <= {(b"state-of-join", True), (b"state-of-sync", False)}
        # And the members of the cluster still talk to each other.
        await eventually(lambda: states(member) == {"seed": MemberState.ALIVE, "member": MemberState.ALIVE})
        assert member.metrics().tls_handshake_failures == 0


async def test_a_tls_client_without_a_certificate_reads_nothing(tmp_path: Path) -> None:
    cluster = CertAuthority(tmp_path, "cluster")
    async with Mesh(_config("seed", cluster.issue("seed"))) as seed:
        host, port = seed.addr.rsplit(":", 1)
        anonymous = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        anonymous.check_hostname = False
        anonymous.load_verify_locations(cafile=cluster.cert_file)  # it trusts the seed; the seed cannot trust it
        reader, writer = await asyncio.open_connection(host, int(port), ssl=anonymous)
        writer.write(b"\x01\x01\x00\x00\x00\x00")  # any request: the seed must not get to answer it
        with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
            await asyncio.wait_for(reader.readexactly(1), 5.0)
        writer.close()
        await eventually(lambda: seed.metrics().tls_handshake_failures == 1)
        assert seed.metrics().streams_in == 0


async def test_a_handshake_is_bounded_by_the_tcp_timeout(tmp_path: Path) -> None:
    config = _config("seed", CertAuthority(tmp_path, "cluster").issue("seed")).with_(tcp_timeout_s=0.5)
    async with Mesh(config) as seed:
        host, port = seed.addr.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))  # and never say hello
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await asyncio.wait_for(reader.read(), 5.0) == b""
        assert loop.time() - started < 3.0
        writer.close()


async def test_handshakes_never_finished_are_capped_and_closed_while_the_members_keep_talking(tmp_path: Path) -> None:
    await _handshake_flood(tmp_path)


def test_the_handshake_flood_on_uvloop(tmp_path: Path) -> None:
    uvloop.run(_handshake_flood(tmp_path))


async def _handshake_flood(tmp_path: Path) -> None:
    """13 sources × 8 connections that never send a ClientHello (or half of one): they count against the
    stream caps from the accept (64 in total, 8 per address), the ones over a cap are closed at once and the
    rest after the handshake timeout (TLS_HANDSHAKE_TIMEOUT_S, or tcp_timeout_s when shorter); the real
    members stay alive to each other and still push-pull."""
    ca = CertAuthority(tmp_path, "cluster")
    async with AsyncExitStack() as stack:
        seed = await stack.enter_async_context(Mesh(_config("seed", ca.issue("seed"))))
        member = await stack.enter_async_context(Mesh(_config("member", ca.issue("member"))))
        assert await member.join([seed.addr]) == 1
        both = {"seed": MemberState.ALIVE, "member": MemberState.ALIVE}
        await eventually(lambda: states(seed) == both and states(member) == both)
        host, port = seed.addr.rsplit(":", 1)
        loop = asyncio.get_running_loop()
        flood: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        started = loop.time()
        for source in range(2, 15):
            for k in range(MAX_INBOUND_STREAMS_PER_HOST):
                reader, writer = await asyncio.open_connection(host, int(port), local_addr=(f"127.0.0.{source}", 0))
                if k % 2:
                    writer.write(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")  # a ClientHello's first bytes
                flood.append((reader, writer))
        extra = [await asyncio.open_connection(host, int(port), local_addr=("127.0.0.2", 0)) for _ in range(2)]

        async def closed_after(reader: asyncio.StreamReader) -> float:
            with contextlib.suppress(ConnectionError):
                assert await asyncio.wait_for(reader.read(), 10.0) == b""
            return loop.time() - started

        closing = asyncio.gather(*(closed_after(r) for r, _ in flood + extra))
        while not closing.done():  # meanwhile the members keep probing each other: nobody is suspected
            assert states(seed) == both and states(member) == both
            await asyncio.sleep(0.05)
        times = await closing
        refused = seed.metrics().streams_refused
        assert refused >= len(flood) + len(extra) - MAX_INBOUND_STREAMS, refused
        timeout_s = min(TLS_HANDSHAKE_TIMEOUT_S, CONFIG.tcp_timeout_s)
        assert max(times) < timeout_s + 2.0, max(times)
        assert sorted(times)[len(times) - MAX_INBOUND_STREAMS] > timeout_s - 0.3  # held, then cut
        for _, writer in flood + extra:
            writer.close()
        third = await stack.enter_async_context(Mesh(_config("third", ca.issue("third"))))
        assert await third.join([seed.addr]) == 1  # a real handshake and push-pull still get through
        assert seed.metrics().tls_handshake_failures == 0


async def test_bad_tls_files_are_refused_naming_the_file(tmp_path: Path) -> None:
    ca = CertAuthority(tmp_path, "cluster")
    good, other = ca.issue("a"), ca.issue("b")
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    encrypted = tmp_path / "encrypted.key"
    encrypted.write_bytes(
        ec.generate_private_key(ec.SECP256R1()).private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    cases = [
        ((tmp_path / "missing.crt", good.key, good.ca), "tls_cert_file .*missing.crt: No such file"),
        ((junk, good.key, good.ca), "tls_cert_file .*junk.pem: no PEM certificate"),
        ((good.cert, junk, good.ca), "tls_key_file .*junk.pem: not a PEM private key"),
        ((good.cert, encrypted, good.ca), "tls_key_file .*encrypted.key: encrypted private keys are not supported"),
        ((good.cert, other.key, good.ca), "tls_key_file .*b.key: does not match the certificate"),
        ((good.cert, good.key, junk), "tls_ca_file .*junk.pem: no PEM certificate"),
    ]
    for (cert, key, ca_file), message in cases:
        with pytest.raises(TlsError, match=message):
            TlsContexts.load(str(cert), str(key), str(ca_file))
    contexts = TlsContexts.load(str(good.cert), str(good.key), str(good.ca))
    for context in (contexts.server, contexts.client):
        assert context.verify_mode == ssl.CERT_REQUIRED and context.minimum_version >= ssl.TLSVersion.TLSv1_3
    assert not contexts.client.check_hostname
    # The mesh loads them at start.
    bad = TlsFiles(cert=good.cert, key=other.key, ca=good.ca)
    with pytest.raises(TlsError, match="does not match"):
        await Mesh(_config("a", bad)).start()


def test_tls_config_is_all_three_files_or_none() -> None:
    with pytest.raises(ValueError, match=r"^tls_key_file, tls_ca_file: required with tls_cert_file"):
        MeshConfig(tls_cert_file="node.crt")
    with pytest.raises(ValueError, match=r"^tls_cert_file: required with tls_key_file, tls_ca_file"):
        MeshConfig(tls_key_file="node.key", tls_ca_file="ca.crt")
    assert not MeshConfig().tls_enabled
    assert MeshConfig(tls_cert_file="n.crt", tls_key_file="n.key", tls_ca_file="ca.crt").tls_enabled
