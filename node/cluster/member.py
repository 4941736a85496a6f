"""The node's member of the mesh: start it, keep joining the seeds in the background until one answers, and
leave gracefully on shutdown (so peers see LEFT, not a failure)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from mesh import Delegate, JoinError, Mesh
from node.cluster.config import ClusterConfig, mesh_config, node_meta, seeds

log = logging.getLogger(__name__)

# After a join attempt gives up (MeshConfig.join_timeout_s), wait this long before trying the seeds again.
REJOIN_PAUSE_S = 5.0


async def _join_forever(mesh: Mesh, peers: list[str]) -> None:
    while True:
        try:
            answered = await mesh.join(peers)
            log.info("joined the mesh through %d of %d seed(s)", answered, len(peers))
            return
        except JoinError as exc:
            log.warning("%s; trying again in %.0f s", exc, REJOIN_PAUSE_S)
            await asyncio.sleep(REJOIN_PAUSE_S)


@contextlib.asynccontextmanager
async def run_mesh(config: ClusterConfig, *, http_addr: str, delegate: Delegate | None = None) -> AsyncIterator[Mesh]:
    """Start this node's member (``delegate``: the application state it carries); yield it; leave gracefully
    and stop on exit.

    Raises mesh errors (TransportError: the port is taken; KeyringError: a bad key file) at start.
    """
    mesh = Mesh(mesh_config(config), meta=node_meta(config, http_addr), delegate=delegate)
    if config.unprotected:  # only with --mesh-insecure (ClusterConfig refuses it otherwise)
        log.warning(
            "INSECURE MESH: %s is reachable from other hosts without a keyring (--mesh-insecure): anyone who can "
            "send it a packet can forge members, deaths and cluster state; use --mesh-key-file",
            config.mesh_bind,
        )
    elif not config.mesh_key_file:
        log.info("mesh on loopback %s without a keyring: gossip is unencrypted (fine on one host)", config.mesh_bind)
    await mesh.start()
    peers = seeds(config)
    joining = asyncio.create_task(_join_forever(mesh, peers), name="mesh-join") if peers else None
    try:
        log.info("mesh member %s listening on %s", mesh.name, mesh.addr)
        yield mesh
    finally:
        if joining is not None:
            joining.cancel()
            await asyncio.gather(joining, return_exceptions=True)
        # Also on SIGTERM (cancellation): peers must see a graceful LEFT, not a failure.
        try:
            await mesh.leave()
        except Exception as exc:
            log.warning("graceful leave failed: %s", exc)
        await mesh.shutdown()


def publish_http_addr(mesh: Mesh, config: ClusterConfig, http_addr: str) -> None:
    """Tell the cluster where this node serves HTTP (known only after binding when the port was 0)."""
    mesh.update_meta(node_meta(config, http_addr))
