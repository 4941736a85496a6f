"""The node's member of the mesh: start it, keep joining the seeds in the background until one answers, and
leave gracefully on shutdown (so peers see LEFT, not a failure)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from mesh import WILDCARD_HOSTS, Delegate, JoinError, MemberState
from node.cluster.config import ClusterConfig, mesh_config, node_meta, seeds
from node.cluster.seeds import host_address, resolve_seeds, split_addr

if TYPE_CHECKING:
    from mesh import Mesh

log = logging.getLogger(__name__)

# After a join round gives up, wait this long before resolving and trying the seeds again.
REJOIN_PAUSE_S = 5.0
# One join round's bound: then the seed names are resolved again, so a seed that restarted under a new address
# (a container, a pod) is found within a round, not after the mesh's whole join_timeout_s.
JOIN_ROUND_S = 10.0


async def _join_forever(mesh: Mesh, peers: list[str]) -> None:
    while True:
        addrs = await resolve_seeds(peers, own=mesh.addr)
        if not addrs:
            log.warning("no other member at %s yet; trying again in %.0f s", ", ".join(peers), REJOIN_PAUSE_S)
        else:
            try:
                async with asyncio.timeout(JOIN_ROUND_S):
                    answered = await mesh.join(addrs)
                log.info("joined the mesh through %d of %d seed(s)", answered, len(addrs))
                return
            except (JoinError, TimeoutError) as exc:
                reason = str(exc) or f"no seed of {addrs} answered within {JOIN_ROUND_S:.0f} s"
                log.warning("%s; trying again in %.0f s", reason, REJOIN_PAUSE_S)
        await asyncio.sleep(REJOIN_PAUSE_S)


async def _advertise(config: ClusterConfig) -> str:
    """With a wildcard --mesh-bind and no --mesh-advertise, the address of this host's name (a container's
    address on its network); else "" (the configured literal address is advertised as is). Raises OSError if
    the host name does not resolve."""
    if config.mesh_advertise or split_addr(config.mesh_bind)[0] not in WILDCARD_HOSTS:
        return ""
    return await host_address()


@contextlib.asynccontextmanager
async def run_mesh(config: ClusterConfig, *, http_addr: str, delegate: Delegate | None = None) -> AsyncIterator[Mesh]:
    """Start this node's member (``delegate``: the application state it carries); yield it; leave gracefully
    and stop on exit.

    Raises mesh errors (TransportError: the port is taken; KeyringError: a bad key file) at start, OSError
    when a wildcard bind's host name does not resolve.
    """
    from mesh import Mesh  # the runtime loads only when a node runs a mesh

    advertise = await _advertise(config)
    if advertise:
        log.info("mesh: advertising %s to peers", advertise)
    mesh = Mesh(mesh_config(config, advertise=advertise), meta=node_meta(config, http_addr), delegate=delegate)
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
        await leave_mesh(mesh)
        await mesh.shutdown()


def has_left(mesh: Mesh) -> bool:
    return any(m.name == mesh.name and m.state == MemberState.LEFT for m in mesh.members())


async def leave_mesh(mesh: Mesh) -> None:
    """Leave gracefully (bounded by the mesh's leave_timeout_s), once: a drain leaves before the listener
    closes, and the unwinding of run_mesh then has nothing left to do. Failures are logged, not raised."""
    if has_left(mesh):
        return
    try:
        await mesh.leave()
    except Exception as exc:
        log.warning("graceful leave failed: %s", exc)


def publish_http_addr(mesh: Mesh, config: ClusterConfig, http_addr: str) -> None:
    """Tell the cluster where this node serves HTTP (known only after binding when the port was 0)."""
    mesh.update_meta(node_meta(config, http_addr))
