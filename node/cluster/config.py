"""The node's cluster config and what it means for the mesh: the MeshConfig profile, the seeds to join and
the metadata this node publishes about itself.

A leaf: imports only `mesh`'s public API, so `node.config` can hold it without importing any component.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Literal

from mesh import WILDCARD_HOSTS, MeshConfig, NodeMeta, check_addr, check_member_addr, join_addr

Profile = Literal["lan", "wan", "local"]


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
            "help": "IP:PORT peers reach this node at (default: the bind address, or with a wildcard bind the "
            "address this host's name resolves to, e.g. a container's)"
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
    mesh_insecure: bool = field(
        default=False,
        metadata={
            "help": "allow a mesh on a non-loopback address without --mesh-key-file: anyone who reaches the port "
            "can forge membership and cluster state (a warning is logged at start)"
        },
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
            if not self.mesh_advertise and host.strip("[]") not in WILDCARD_HOSTS:
                try:  # advertised as is: members gossip literal IP addresses, never names
                    check_member_addr(join_addr(host.strip("[]"), int(port) or 1))
                except ValueError as exc:
                    raise ValueError(f"mesh_bind: {exc} (or give --mesh-advertise IP:PORT)") from None
        for addr in self.join:  # seeds may be names: joining resolves them
            check_addr(addr)
        if self.mesh_advertise:
            try:
                check_member_addr(self.mesh_advertise)
            except ValueError as exc:
                raise ValueError(f"mesh_advertise: {exc}") from None
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
        if self.unprotected and not self.mesh_insecure:
            raise ValueError(
                f"mesh_insecure: --mesh-bind {self.mesh_bind} is reachable from other hosts and there is no "
                "--mesh-key-file, so anyone who can send it a packet can forge members, deaths and cluster state"
                f"{' (mutual TLS protects TCP streams only, not UDP gossip)' if self.mesh_tls_cert else ''}; "
                "give every node a keyring with --mesh-key-file, bind a loopback address, or accept the risk "
                "with --mesh-insecure"
            )

    @property
    def enabled(self) -> bool:
        return bool(self.mesh_bind)

    @property
    def unprotected(self) -> bool:
        """The mesh listens where other hosts can reach it and has no keyring: its UDP gossip is forgeable
        by anyone (mutual TLS covers TCP streams only). Loopback binds are for tests and demos on one host."""
        return self.enabled and not self.mesh_key_file and not is_loopback(_split(self.mesh_bind)[0])

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


def is_loopback(host: str) -> bool:
    """``host`` (a literal IP or "localhost") is a loopback address (127.0.0.0/8, ::1); a wildcard is not."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: it may resolve anywhere
        return False


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


def node_meta(config: ClusterConfig, http_addr: str) -> NodeMeta:
    """What this node publishes about itself. Raises ValueError if it exceeds the metadata bounds."""
    return NodeMeta.create(http_addr=http_addr, version=node_version(), roles=config.roles)
