"""Unauthenticated streams at a real node's mesh port: how much memory can a stranger make it hold?

    python -m chaos.flood --streams 100 [--sources 50] [--key] [--workdir DIR]

Starts one `smg-node serve` (mesh on 127.0.0.1, optionally with a keyring), opens ``--streams`` TCP
connections to its mesh port at once (from ``--sources`` loopback addresses 127.0.1.x, so per-address
limits do not hide the total ones), and on each sends a stream frame header announcing the largest frame
the wire allows, then that many bytes of garbage (all but the last byte, so a node that buffers keeps
waiting). Prints one JSON object: the node's resident memory before and its peak (VmHWM) during the flood,
how many streams the node closed on us, and whether it still answers. The chaos test asserts on the same
numbers (chaos/test_hardening.py).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import struct
import tempfile
import time
from pathlib import Path
from typing import Any

from chaos.cluster import FAST_PROFILE, Cluster, Node, fetch_view, free_port, sim_worker
from mesh.limits import MAX_STREAM_FRAME_BYTES, PROTOCOL_VERSION
from mesh.messages import MessageType

#: Bytes per write of the flood: large enough to push a stream's 16 MiB within seconds.
CHUNK_BYTES = 64 * 1024
#: How long the flood lasts at most: past the node's stream deadline (tcp_timeout_s of the profile).
FLOOD_S = 12.0


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    """A memory figure of ``pid`` from /proc (VmRSS: now; VmHWM: the peak so far), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/{pid}/status")


async def _one(host: str, port: int, source: str, header: bytes, length: int, deadline: float) -> bool:
    """Send ``header`` and ``length - 1`` bytes, then hold the connection; True if the node closed it first."""
    try:
        reader, writer = await asyncio.open_connection(host, port, local_addr=(source, 0))
    except OSError:
        return True
    closed = False
    try:
        writer.write(header)
        chunk = bytes(CHUNK_BYTES)
        sent = 0
        while sent < length - 1 and time.monotonic() < deadline:
            part = chunk[: min(CHUNK_BYTES, length - 1 - sent)]
            writer.write(part)
            async with asyncio.timeout(max(0.01, deadline - time.monotonic())):
                await writer.drain()
            sent += len(part)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.01, deadline - time.monotonic())):
                closed = await reader.read(1) == b""
    except (OSError, TimeoutError):
        closed = time.monotonic() < deadline
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    return closed


async def flood(
    host: str, port: int, streams: int, *, sources: int = 1, encrypted: bool = False, duration_s: float = FLOOD_S
) -> int:
    """Run the flood from ``sources`` addresses; returns how many streams the node closed before ``duration_s``."""
    msg_type = MessageType.ENCRYPTED_CHUNKS if encrypted else MessageType.PUSH_PULL
    length = MAX_STREAM_FRAME_BYTES
    header = struct.pack(">BBI", PROTOCOL_VERSION, msg_type, length)
    deadline = time.monotonic() + duration_s
    addrs = [f"127.0.1.{k % sources + 1}" for k in range(streams)]
    results = await asyncio.gather(*(_one(host, port, addrs[k], header, length, deadline) for k in range(streams)))
    return sum(results)


def measure(workdir: Path, streams: int, *, sources: int, key: bool) -> dict[str, Any]:
    from node.models.prepare import prepare_model

    model_dir = prepare_model("llama3", workdir / "models")
    port = free_port(["127.0.0.1"])
    with (
        sim_worker(model_dir, workdir / "sim.log") as worker,
        Cluster(workdir=workdir, model_dir=model_dir, worker_url=worker, profile=FAST_PROFILE) as cluster,
    ):
        node = Node(
            name="n1",
            mesh_host="127.0.0.1",
            mesh_port=port,
            http_host="127.0.0.1",
            http_port=free_port(["127.0.0.1"]),
        )
        if key:
            node.key_file = workdir / "mesh.keys"
            node.key_file.write_text(base64.b64encode(os.urandom(32)).decode() + "\n")
            node.key_file.chmod(0o600)
        cluster.add(node)
        cluster.start(node)
        cluster.wait_up(node)
        assert node.proc is not None
        pid = node.proc.pid
        before = rss_kib(pid)
        started = time.monotonic()
        closed = asyncio.run(flood("127.0.0.1", port, streams, sources=sources, encrypted=key))
        took = time.monotonic() - started
        peak = rss_kib(pid, "VmHWM")
        return {
            "streams": streams,
            "sources": sources,
            "key": key,
            "rss_before_mib": round(before / 1024, 1),
            "rss_peak_mib": round(peak / 1024, 1),
            "closed_by_node": closed,
            "flood_s": round(took, 1),
            "alive_after": node.running and fetch_view(node.url) is not None,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=100)
    parser.add_argument("--sources", type=int, default=50, help="distinct source addresses (127.0.1.x)")
    parser.add_argument("--key", action="store_true", help="run the node with a keyring")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="flood-") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        print(json.dumps(measure(workdir, args.streams, sources=args.sources, key=args.key)), flush=True)


if __name__ == "__main__":
    main()
