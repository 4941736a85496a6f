"""The node's membership in the mesh: config, start/join/leave, and what the node publishes about itself.

`mesh/` knows nothing of LLMs; this module maps the node's typed config onto a MeshConfig profile, starts the
member, keeps joining the seeds in the background until one answers, and leaves gracefully on shutdown (so
peers see LEFT, not a failure).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Literal

from mesh.config import MeshConfig
from mesh.delegate import Delegate
from mesh.errors import JoinError, KeyringError
from mesh.keyring import Keyring
from mesh.member import MemberState, NodeMeta, check_addr
from mesh.runtime import Mesh
from mesh.transport import WILDCARD_HOSTS
from node.seeds import advertise_host, is_ip, resolve_seeds

log = logging.getLogger(__name__)

Profile = Literal["lan", "wan", "local"]
# After a join round gives up, wait this long before resolving and trying the seeds again.
REJOIN_PAUSE_S = 5.0
# One join round's bound: then the seed names are resolved again, so a seed that restarted under a new address
# (a container, a pod) is found within a round, not after the mesh's whole join_timeout_s.
JOIN_ROUND_S = 10.0


def node_version() -> str:
    try:
        return version("smg-node")
    except PackageNotFoundError:  # running from a source tree without an install
        return "0+unknown"


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    mesh_bind: str = field(
        default="", metadata={"help": "host:port for mesh gossip (UDP) and push-pull (TCP); empty: no mesh"}
    )
    join: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "mesh address of a member to join, host:port; a DNS name stands for every address it "
            "resolves to, resolved again on each retry",
            "metavar": "PEER",
        },
    )
    mesh_advertise: str = field(
        default="",
        metadata={
            "help": "host:port peers reach this node at (a name is resolved at start; default: the bind "
            "address, or with a wildcard bind the address of this host's name)"
        },
    )
    mesh_key_file: str = field(
        default="",
        metadata={"help": "keyring file (base64 keys, first is primary): encrypts gossip; re-read on SIGHUP"},
    )
    mesh_tls_cert: str = field(
        default="", metadata={"help": "PEM certificate for mutual TLS on mesh TCP streams (with --mesh-tls-key/-ca)"}
    )
    mesh_tls_key: str = field(default="", metadata={"help": "unencrypted PEM private key of --mesh-tls-cert"})
    mesh_tls_ca: str = field(
        default="", metadata={"help": "PEM cluster CA: a peer's certificate must chain to it (names unchecked)"}
    )
    mesh_profile: Profile = field(default="lan", metadata={"help": "timing profile: lan, wan or local"})
    mesh_probe_interval_s: float = field(
        default=0.0, metadata={"help": "override the profile's probe interval (0: the profile's)"}
    )
    node_name: str = field(default="", metadata={"help": "unique member name (default: the mesh address)"})
    mesh_roles: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "KEY=VALUE label published in this node's member metadata (a bare NAME: NAME=''), repeatable",
            "flag": "--mesh-role",
            "metavar": "KEY=VALUE",
        },
    )
    process_index: int = field(
        default=0,
        metadata={"cli": False, "help": "index of this process under --processes (set by the supervisor)"},
    )
    process_count: int = field(
        default=1,
        metadata={"cli": False, "help": "how many sibling processes --processes runs (set by the supervisor)"},
    )

    def __post_init__(self) -> None:
        if self.mesh_bind:  # port 0 binds a free port
            host, _, port = self.mesh_bind.rpartition(":")
            if not host or not port.isdigit() or int(port) > 65535:
                raise ValueError(f"mesh_bind: expected host:port, got {self.mesh_bind!r}")
        for addr in (self.mesh_advertise, *self.join):
            if addr:
                check_addr(addr)
        try:
            NodeMeta.create(version=node_version(), roles=self.roles)
        except ValueError as exc:
            raise ValueError(f"mesh_roles: {exc}") from None
        if self.join and not self.mesh_bind:
            raise ValueError("join needs mesh_bind (--mesh-bind host:port)")
        tls = {"mesh_tls_cert": self.mesh_tls_cert, "mesh_tls_key": self.mesh_tls_key, "mesh_tls_ca": self.mesh_tls_ca}
        missing = [name for name, value in tls.items() if not value]
        if 0 < len(missing) < len(tls):
            raise ValueError(
                f"mutual TLS needs all of mesh_tls_cert, mesh_tls_key, mesh_tls_ca; missing: {', '.join(missing)}"
            )

    @property
    def enabled(self) -> bool:
        return bool(self.mesh_bind)

    @property
    def roles(self) -> dict[str, str]:
        """The --mesh-role labels as the member metadata's role map. Raises ValueError for an empty or
        repeated key."""
        out: dict[str, str] = {}
        for entry in self.mesh_roles:
            key, _, value = entry.partition("=")
            if not key.strip():
                raise ValueError(f"expected KEY=VALUE or NAME, got {entry!r}")
            if key in out:
                raise ValueError(f"role {key!r} given twice")
            out[key] = value
        return out


def _split(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


def mesh_config(config: ClusterConfig, *, advertise: str = "") -> MeshConfig:
    """The MeshConfig for this process. Under --processes N, process k binds port+k and joins process 0.
    ``advertise``: the literal address to advertise instead of --mesh-advertise's (or the bind's) host."""
    host, port = _split(config.mesh_bind)
    if port:
        port += config.process_index
    overrides: dict[str, object] = {
        "bind_addr": host,
        "bind_port": port,
        "keyring_file": config.mesh_key_file,
        "tls_cert_file": config.mesh_tls_cert,
        "tls_key_file": config.mesh_tls_key,
        "tls_ca_file": config.mesh_tls_ca,
    }
    if config.mesh_advertise:
        adv_host, adv_port = _split(config.mesh_advertise)
        overrides.update(advertise_addr=adv_host, advertise_port=adv_port + config.process_index if adv_port else 0)
    if advertise:
        overrides["advertise_addr"] = advertise
    if config.node_name:
        overrides["node_name"] = (
            config.node_name if config.process_index == 0 else f"{config.node_name}-{config.process_index}"
        )
    profile = {"lan": MeshConfig.lan, "wan": MeshConfig.wan, "local": MeshConfig.local}[config.mesh_profile]
    if config.mesh_probe_interval_s > 0:
        # The ack timeout must stay below the interval: keep the profile's, capped at half the interval
        # (memberlist's LAN ratio).
        interval = config.mesh_probe_interval_s
        overrides["probe_interval_s"] = interval
        overrides["probe_timeout_s"] = min(profile().probe_timeout_s, interval / 2)
    return profile(**overrides)


def seeds(config: ClusterConfig) -> list[str]:
    """Where to join: the configured peers, plus every sibling of our process group.

    Every sibling, not only process 0: a sibling the supervisor restarts (process 0 included) must find the
    living ones at once, or it would serve alone with its own registry until a push-pull happened to reach it.
    """
    out = list(config.join)
    host, port = _split(config.mesh_advertise or config.mesh_bind) if config.enabled else ("", 0)
    if config.process_count > 1 and port:  # with port 0 the siblings' ports are unknown: only --join seeds
        out += [f"{host}:{port + k}" for k in range(config.process_count) if k != config.process_index]
    return out


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
    """The literal host to advertise when --mesh-advertise (or a wildcard/named --mesh-bind) needs resolving;
    "" when the configured one is already an address. Raises OSError if the name does not resolve."""
    bind_host, _ = _split(config.mesh_bind)
    adv_host = _split(config.mesh_advertise)[0] if config.mesh_advertise else ""
    configured = adv_host or bind_host
    if configured not in WILDCARD_HOSTS and is_ip(configured):
        return ""
    return await advertise_host(bind_host, adv_host)


@contextlib.asynccontextmanager
async def run_mesh(config: ClusterConfig, *, http_addr: str, delegate: Delegate | None = None) -> AsyncIterator[Mesh]:
    """Start this node's member (``delegate``: the application state it carries); yield it; leave gracefully
    and stop on exit.

    Raises mesh errors (TransportError: the port is taken; KeyringError: a bad key file) at start, OSError
    when the advertise name does not resolve.
    """
    advertise = await _advertise(config)
    if advertise:
        log.info("mesh: advertising %s to peers", advertise)
    mesh = Mesh(mesh_config(config, advertise=advertise), meta=node_meta(config, http_addr), delegate=delegate)
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


def node_meta(config: ClusterConfig, http_addr: str) -> NodeMeta:
    """What this node publishes about itself. Raises ValueError if it exceeds the metadata bounds."""
    return NodeMeta.create(http_addr=http_addr, version=node_version(), roles=config.roles)


def publish_http_addr(mesh: Mesh, config: ClusterConfig, http_addr: str) -> None:
    """Tell the cluster where this node serves HTTP (known only after binding when the port was 0)."""
    mesh.update_meta(node_meta(config, http_addr))


# -- key rotation without downtime --


def apply_keys(ring: Keyring, keys: Sequence[bytes]) -> tuple[int, int]:
    """Make ``ring`` hold exactly ``keys`` with ``keys[0]`` the primary: add, then switch, then remove (the
    ring is never without the key that decrypts a peer's traffic). Returns (added, removed) counts."""
    if not keys:
        raise KeyringError("keyring: at least one key is required")
    before = set(ring.keys)
    for key in keys:
        ring.add(key)
    ring.use(keys[0])
    stale = [key for key in ring.keys if key not in keys]
    for key in stale:
        ring.remove(key)
    return len(set(keys) - before), len(stale)


def reload_key_file(mesh: Mesh, path: str) -> bool:
    """Apply the key file at ``path`` to ``mesh``'s live keyring (see apply_keys). A file that cannot be read
    or parsed is logged and changes nothing, as does a mesh running without encryption. Returns whether the
    keyring was updated."""
    ring = mesh.keyring
    if ring is None:
        log.error("mesh key file not reloaded: this mesh runs unencrypted (restart with --mesh-key-file)")
        return False
    try:
        wanted = Keyring.load(path)
    except KeyringError as exc:
        log.error("mesh key file %s not reloaded, keyring unchanged: %s", path, exc)
        return False
    added, removed = apply_keys(ring, wanted.keys)
    log.info(
        "mesh key file %s reloaded: %d key(s), %d added, %d removed, its first key is the primary",
        path,
        len(ring.keys),
        added,
        removed,
    )
    return True


class KeyFileReload:
    """SIGHUP's action in `smg-node serve`: re-read the key file into the serving node's keyring.

    Installed before the node starts: until it serves (and again while it shuts down) a SIGHUP is logged and
    ignored, instead of ending the process by its default action.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._mesh: Mesh | None = None

    def __call__(self) -> None:
        if self._mesh is None:
            log.warning("SIGHUP while the mesh is not serving: key file not reloaded")
            return
        reload_key_file(self._mesh, self.path)

    @contextlib.contextmanager
    def serving(self, mesh: Mesh | None) -> Iterator[None]:
        """Within the block, SIGHUP reloads the key file into ``mesh``."""
        self._mesh = mesh
        try:
            yield
        finally:
            self._mesh = None
