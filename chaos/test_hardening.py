"""A real node's mesh port against strangers: stream floods, fuzzed packets and frames, and the refusal to
run an unprotected mesh where other hosts can reach it.

The sans-IO rules behind these are tested in tests/mesh/test_mesh_hardening.py; here they meet real sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chaos.cluster import REPO, SMG_NODE, Cluster, Node, Profile, fetch_view, free_port, wait_until
from chaos.flood import flood, rss_kib
from chaos.test_encryption import key_file
from mesh.codec import compound, encode_message, seal_frame, seal_packet
from mesh.limits import MAX_INBOUND_BUFFER_BYTES, MAX_U32, PROTOCOL_VERSION
from mesh.member import MemberState, NodeMeta, check_member_addr
from mesh.messages import Alive, Dead, Message, MessageType, Ping, PushPull, PushPullMember, Suspect

#: Growth of the node's peak resident memory a flood of unauthenticated streams may cause: the shared frame
#: buffer (joined once: twice its size) plus interpreter slack. Before the bounds, 100 streams took 1.75 GB.
FLOOD_RSS_BOUND_MIB = 2 * MAX_INBOUND_BUFFER_BYTES / 2**20 + 48
#: Growth of resident memory allowed over a fuzz run: a few caches (bounded LRUs) and allocator slack.
FUZZ_RSS_BOUND_MIB = 48
#: How long a fuzz case waits for the node to close a stream it sent (the node answers or hangs up at once
#: when we half-close; bounded by its header timeout otherwise).
STREAM_CASE_TIMEOUT_S = 3.0
CLI_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def nodes(
    model_dir: Path, worker_url: str, profile: Profile, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Cluster, Node, Node]]:
    """``open``: keyless on loopback (anyone local may gossip); ``sealed``: with a keyring."""
    workdir = tmp_path_factory.mktemp("hardening")
    port = free_port(["127.0.0.41", "127.0.0.42"])
    with Cluster(workdir=workdir, model_dir=model_dir, worker_url=worker_url, profile=profile) as cluster:
        open_, sealed = (
            Node(name=name, mesh_host=host, mesh_port=port, http_host="127.0.0.1", http_port=free_port(["127.0.0.1"]))
            for name, host in (("open", "127.0.0.41"), ("sealed", "127.0.0.42"))
        )
        sealed.key_file = key_file(workdir / "mesh.keys")
        for node in (open_, sealed):
            cluster.add(node)
        cluster.start(open_, sealed)
        cluster.wait_up(open_, sealed)
        yield cluster, open_, sealed


def pid(node: Node) -> int:
    assert node.proc is not None
    return node.proc.pid


def members_well_formed(node: Node) -> dict[str, str]:
    """The node's members (name -> mesh address), each checked the way the wire checks them."""
    view = fetch_view(node.url)
    assert view is not None, f"{node.name} stopped answering"
    for name, member in view.items():
        assert name and name.isprintable(), name
        check_member_addr(member.mesh_addr)
        assert member.http_addr.isprintable(), member
    return {name: m.mesh_addr for name, m in view.items()}


def test_a_stream_flood_is_refused_with_bounded_memory(nodes: tuple[Cluster, Node, Node]) -> None:
    cluster, open_, sealed = nodes
    for node, encrypted in ((open_, False), (sealed, True)):
        before = rss_kib(pid(node))
        closed = asyncio.run(
            flood(node.mesh_host, node.mesh_port, 100, sources=20, encrypted=encrypted, duration_s=6.0)
        )
        grown_mib = (rss_kib(pid(node), "VmHWM") - before) / 1024
        assert grown_mib < FLOOD_RSS_BOUND_MIB, f"{node.name}: peak grew by {grown_mib:.0f} MiB"
        assert closed > 0
        assert cluster.counters([node], "streams_refused")[node.name] > 0
        assert node.running and fetch_view(node.url) is not None
        print(f"{node.name}: 100 streams, peak resident memory +{grown_mib:.0f} MiB, {closed} closed by the node")
    assert "inbound stream refused" in cluster.tail(open_, lines=400)


# -- fuzzing the mesh port ---------------------------------------------------------------------------------


FORGED_META = NodeMeta.create(http_addr="127.0.0.1:1", version="0")
gossip = st.one_of(
    st.builds(Alive, st.integers(0, MAX_U32), st.sampled_from(["open", "sealed", "peer-1"]),
              st.sampled_from(["127.0.0.41:1", "127.0.0.99:7946"]), st.just(FORGED_META)),
    st.builds(Suspect, st.integers(0, MAX_U32), st.sampled_from(["open", "sealed", "peer-1"]), st.just("x")),
    st.builds(Dead, st.integers(0, MAX_U32), st.sampled_from(["open", "sealed", "peer-1"]), st.just("x")),
    st.builds(Ping, st.integers(0, MAX_U32), st.sampled_from(["", "open"]), st.just("x"), st.just("127.0.0.99:7946")),
)  # fmt: skip
push_pulls = st.builds(
    PushPull,
    st.booleans(),
    st.lists(
        st.builds(PushPullMember, st.sampled_from(["open", "peer-1", "peer-2"]), st.just("127.0.0.99:7946"),
                  st.just(FORGED_META), st.integers(0, MAX_U32), st.sampled_from(MemberState)),
        max_size=3,
    ).map(tuple),
    st.binary(max_size=64),
)  # fmt: skip


def mutate(data: st.DataObject, raw: bytes) -> bytes:
    buf = bytearray(raw)
    for _ in range(data.draw(st.integers(0, 3), label="mutations")):
        op = data.draw(st.sampled_from(["cut", "flip", "append"]))
        if op == "cut" and buf:
            del buf[data.draw(st.integers(0, len(buf) - 1)) :]
        elif op == "flip" and buf:
            buf[data.draw(st.integers(0, len(buf) - 1))] = data.draw(st.integers(0, 255))
        else:
            buf += data.draw(st.binary(max_size=32))
    return bytes(buf)


def send_datagram(node: Node, data: bytes) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.sendto(data, (node.mesh_host, node.mesh_port))


def send_stream(node: Node, data: bytes) -> None:
    """One connection: send ``data``, half-close, read until the node closes (bounded)."""
    with (
        socket.create_connection((node.mesh_host, node.mesh_port), timeout=STREAM_CASE_TIMEOUT_S) as sock,
        contextlib.suppress(OSError),
    ):
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        while sock.recv(65536):
            pass


def case(data: st.DataObject) -> tuple[bytes, bytes]:
    """A datagram and a stream: raw bytes, or mutated valid ones (some with a valid header)."""
    kind = data.draw(st.sampled_from(["raw", "packet", "frame"]), label="kind")
    if kind == "raw":
        raw = data.draw(st.binary(max_size=1500))
        return raw, raw
    msgs: list[Message] = data.draw(st.lists(gossip, min_size=1, max_size=4))
    packet = mutate(data, seal_packet(compound([encode_message(m) for m in msgs]), None))
    frame = seal_frame(encode_message(data.draw(st.one_of(push_pulls, gossip))), None)
    # "frame" keeps the header valid, so bodies get exercised.
    return packet, frame[:6] + mutate(data, frame[6:]) if kind == "frame" else mutate(data, frame)


def fuzz(nodes: tuple[Cluster, Node, Node], examples: int) -> None:
    _, open_, sealed = nodes
    before = {node.name: rss_kib(pid(node)) for node in (open_, sealed)}
    fed = [0]

    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(st.data())
    def one(data: st.DataObject) -> None:
        packet, frame = case(data)
        for node in (open_, sealed):
            send_datagram(node, packet)
            send_stream(node, frame)
        fed[0] += 1

    one()
    assert fed[0] >= examples // 2
    # The sealed node authenticated nothing of it; the open one may have learned syntactically valid members
    # from mutated gossip (that is what a keyless mesh is), never malformed ones.
    wait_until(lambda: set(members_well_formed(sealed)) == {"sealed"}, timeout_s=5, what="the sealed node's view")
    members_well_formed(open_)
    for node in (open_, sealed):
        assert node.running
        grown_mib = (rss_kib(pid(node)) - before[node.name]) / 1024
        assert grown_mib < FUZZ_RSS_BOUND_MIB, f"{node.name}: resident memory grew by {grown_mib:.0f} MiB"
    view = fetch_view(open_.url)
    assert view is not None and view["open"].state == "alive"


def test_fuzzed_packets_and_streams_leave_the_node_alive_and_its_members_well_formed(
    nodes: tuple[Cluster, Node, Node],
) -> None:
    fuzz(nodes, 300)


@pytest.mark.slow
def test_fuzz_thousands_of_cases(nodes: tuple[Cluster, Node, Node]) -> None:
    fuzz(nodes, 3000)


def test_a_forged_death_does_not_evict_a_real_node(nodes: tuple[Cluster, Node, Node]) -> None:
    cluster, open_, _ = nodes
    forged = seal_packet(encode_message(Dead(MAX_U32, "open", "mallory")), None)
    for _ in range(3):
        send_datagram(open_, forged)
    view = fetch_view(open_.url)
    assert view is not None and view["open"].state == "alive" and view["open"].incarnation < MAX_U32
    assert cluster.counters([open_], "incarnations_refused")["open"] >= 3
    wait_until(
        lambda: "implausible incarnation refused" in cluster.tail(open_, lines=400),
        timeout_s=5,
        what="the refusal in the node's log",
    )


def test_a_header_only_stream_is_closed_within_the_header_deadline(nodes: tuple[Cluster, Node, Node]) -> None:
    _, open_, _ = nodes
    with socket.create_connection((open_.mesh_host, open_.mesh_port), timeout=5) as sock:
        sock.sendall(struct.pack(">BB", PROTOCOL_VERSION, MessageType.PUSH_PULL))  # 2 of 6 header bytes, then idle
        assert sock.recv(1) == b""  # closed by the node (before: held for tcp_timeout_s)


# -- the refusal to run unprotected ------------------------------------------------------------------------


def test_an_unprotected_mesh_on_a_reachable_address_is_refused_unless_declared_insecure(
    model_dir: Path, worker_url: str, profile: Profile, tmp_path: Path
) -> None:
    port = free_port(["0.0.0.0"])
    args = ["serve", "--model-path", str(model_dir), "--worker", worker_url, "--mesh-bind", f"0.0.0.0:{port}"]
    refused = subprocess.run(
        [*SMG_NODE, *args], cwd=REPO, capture_output=True, text=True, timeout=CLI_TIMEOUT_S, check=False
    )
    assert refused.returncode != 0
    assert "--mesh-insecure" in refused.stderr and "--mesh-key-file" in refused.stderr, refused.stderr

    with Cluster(workdir=tmp_path, model_dir=model_dir, worker_url=worker_url, profile=profile) as cluster:
        node = Node(
            name="exposed",
            mesh_host="0.0.0.0",
            mesh_port=port,
            http_host="127.0.0.1",
            http_port=free_port(["127.0.0.1"]),
            extra=("--mesh-insecure", "--mesh-advertise", f"127.0.0.1:{port}"),
        )
        cluster.add(node)
        cluster.start(node)
        cluster.wait_up(node)
        warnings = [line for line in cluster.tail(node, lines=400).splitlines() if "INSECURE MESH" in line]
        assert len(warnings) == 1, warnings


def test_a_loopback_or_keyed_mesh_starts_without_the_warning(nodes: tuple[Cluster, Node, Node]) -> None:
    cluster, open_, sealed = nodes
    for node in (open_, sealed):  # both started without --mesh-insecure
        assert "INSECURE MESH" not in cluster.tail(node, lines=400)
