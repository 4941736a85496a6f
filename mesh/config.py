"""Every knob of the mesh in one frozen dataclass, with memberlist's LAN, WAN and local profiles.

The field defaults are the LAN profile; :meth:`MeshConfig.wan` and :meth:`MeshConfig.local` start from it
and change what memberlist's ``DefaultWANConfig`` / ``DefaultLocalConfig`` change. Each field carries a
``help`` string (the node's config loader turns fields into flags, env vars and YAML keys).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Self


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclass(frozen=True, slots=True)
class MeshConfig:
    # -- identity and addresses --
    node_name: str = field(default="", metadata=_help("unique member name; empty: the advertise host:port"))
    bind_addr: str = field(default="0.0.0.0", metadata=_help("address the UDP and TCP listeners bind to"))
    bind_port: int = field(default=7946, metadata=_help("UDP+TCP port to bind; 0 picks a free port"))
    advertise_addr: str = field(
        default="", metadata=_help("address other members reach us at; empty: bind_addr (not a wildcard)")
    )
    advertise_port: int = field(default=0, metadata=_help("port other members reach us at; 0: the bound port"))

    # -- failure detection (SWIM) --
    probe_interval_s: float = field(default=1.0, metadata=_help("time between probes of one member each"))
    probe_timeout_s: float = field(
        default=0.5, metadata=_help("wait for a direct ack before indirect probes; about the 99th pct RTT")
    )
    indirect_checks: int = field(default=3, metadata=_help("members asked to probe on our behalf (ping-req)"))
    disable_tcp_pings: bool = field(
        default=False, metadata=_help("skip the TCP fallback probe after a failed UDP probe")
    )

    # -- suspicion and Lifeguard --
    suspicion_mult: int = field(default=4, metadata=_help("suspicion min = mult x max(1, log10 n) x probe interval"))
    suspicion_max_timeout_mult: int = field(
        default=6, metadata=_help("suspicion max = this x min; 1 disables Lifeguard's dynamic suspicion")
    )
    awareness_max_multiplier: int = field(
        default=8, metadata=_help("cap of the local-health probe slowdown; 1 disables Lifeguard's LHA")
    )
    buddy_system: bool = field(
        default=True, metadata=_help("piggyback a suspicion on the probe to the suspect (Lifeguard buddy)")
    )

    # -- dissemination --
    gossip_interval_s: float = field(default=0.2, metadata=_help("time between gossip rounds"))
    gossip_nodes: int = field(default=3, metadata=_help("members sent queued broadcasts per gossip round"))
    gossip_to_the_dead_time_s: float = field(
        default=30.0, metadata=_help("keep gossiping to a dead member this long, then reap it")
    )
    retransmit_mult: int = field(default=4, metadata=_help("each broadcast is sent mult x ceil(log10(n + 1)) times"))
    push_pull_interval_s: float = field(
        default=30.0, metadata=_help("full-state TCP exchange with a random member; 0 disables")
    )
    tcp_timeout_s: float = field(default=10.0, metadata=_help("connect+exchange deadline of a TCP stream"))

    # -- departed members --
    dead_node_reclaim_time_s: float = field(
        default=0.0,
        metadata=_help("a dead member's name may reappear at a new address after this long; 0: once reaped"),
    )
    reconnect_interval_s: float = field(
        default=30.0, metadata=_help("push-pull with a random failed member this often (heals partitions)")
    )
    reconnect_timeout_s: float = field(
        default=86_400.0, metadata=_help("stop trying to reconnect to a failed member after this long")
    )
    left_reconnect_timeout_s: float = field(
        default=3_600.0,
        metadata=_help(
            "a member that left is also tried this long, so one restarted alone (no --join) is found again; 0: never"
        ),
    )

    # -- lifecycle (the asyncio shell) --
    join_timeout_s: float = field(default=30.0, metadata=_help("give up joining after this long"))
    join_backoff_initial_s: float = field(default=0.5, metadata=_help("first wait between join attempts"))
    join_backoff_max_s: float = field(default=5.0, metadata=_help("cap of the doubling join backoff"))
    leave_timeout_s: float = field(default=5.0, metadata=_help("wait this long for our leave message to be gossiped"))
    keyring_file: str = field(
        default="", metadata=_help("file of base64 AES keys, primary first; empty: no encryption")
    )

    # -- mutual TLS for TCP streams (all three or none) --
    tls_cert_file: str = field(
        default="", metadata=_help("PEM certificate (chain) this member presents on TCP streams; empty: no TLS")
    )
    tls_key_file: str = field(default="", metadata=_help("unencrypted PEM private key of tls_cert_file"))
    tls_ca_file: str = field(
        default="", metadata=_help("PEM cluster CA: peers' certificates must chain to it (host names unchecked)")
    )

    def __post_init__(self) -> None:
        positive = (
            "probe_interval_s",
            "probe_timeout_s",
            "gossip_interval_s",
            "tcp_timeout_s",
            "join_timeout_s",
            "join_backoff_initial_s",
            "join_backoff_max_s",
        )
        for name in positive:
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: must be > 0, got {getattr(self, name)!r}")
        non_negative = (
            "gossip_to_the_dead_time_s",
            "push_pull_interval_s",
            "dead_node_reclaim_time_s",
            "reconnect_interval_s",
            "reconnect_timeout_s",
            "leave_timeout_s",
            "indirect_checks",
            "gossip_nodes",
        )
        for name in non_negative:
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0, got {getattr(self, name)!r}")
        at_least_one = ("suspicion_mult", "suspicion_max_timeout_mult", "awareness_max_multiplier")
        for name in at_least_one:
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)!r}")
        if self.retransmit_mult < 1:
            raise ValueError(f"retransmit_mult: must be >= 1, got {self.retransmit_mult!r}")
        if self.probe_timeout_s >= self.probe_interval_s:
            raise ValueError(
                f"probe_timeout_s: must be < probe_interval_s ({self.probe_interval_s}), got {self.probe_timeout_s}"
            )
        for name in ("bind_port", "advertise_port"):
            if not 0 <= getattr(self, name) <= 65535:
                raise ValueError(f"{name}: must be a port in 0..65535, got {getattr(self, name)!r}")
        tls = {"tls_cert_file": self.tls_cert_file, "tls_key_file": self.tls_key_file, "tls_ca_file": self.tls_ca_file}
        missing = [name for name, path in tls.items() if not path]
        if missing and len(missing) < len(tls):
            given = ", ".join(name for name in tls if name not in missing)
            raise ValueError(f"{', '.join(missing)}: required with {given} (set all three TLS files or none)")

    @property
    def tls_enabled(self) -> bool:
        """TCP streams use mutual TLS (all three tls_* files are set)."""
        return bool(self.tls_cert_file)

    # -- profiles --

    @classmethod
    def lan(cls, **overrides: Any) -> Self:
        """memberlist's DefaultLANConfig: a single data centre, sub-millisecond RTTs."""
        return cls(**overrides)

    @classmethod
    def wan(cls, **overrides: Any) -> Self:
        """memberlist's DefaultWANConfig: members across regions, RTTs up to hundreds of ms."""
        values: dict[str, Any] = {
            "tcp_timeout_s": 30.0,
            "suspicion_mult": 6,
            "push_pull_interval_s": 60.0,
            "probe_timeout_s": 3.0,
            "probe_interval_s": 5.0,
            "gossip_nodes": 4,
            "gossip_interval_s": 0.5,
            "gossip_to_the_dead_time_s": 60.0,
        }
        values.update(overrides)
        return cls(**values)

    @classmethod
    def local(cls, **overrides: Any) -> Self:
        """memberlist's DefaultLocalConfig: loopback or one host; faster everything."""
        values: dict[str, Any] = {
            "tcp_timeout_s": 1.0,
            "indirect_checks": 1,
            "retransmit_mult": 2,
            "suspicion_mult": 3,
            "push_pull_interval_s": 15.0,
            "probe_timeout_s": 0.2,
            "probe_interval_s": 1.0,
            "gossip_interval_s": 0.1,
            "gossip_to_the_dead_time_s": 15.0,
        }
        values.update(overrides)
        return cls(**values)

    def with_(self, **overrides: Any) -> Self:
        """A copy with some fields replaced (validated again)."""
        return dataclasses.replace(self, **overrides)

    def without_lifeguard(self) -> Self:
        """Plain SWIM with suspicion: fixed suspicion timeout, no local health awareness, no buddy system.

        Used to measure what Lifeguard buys; not meant for production.
        """
        return self.with_(awareness_max_multiplier=1, suspicion_max_timeout_mult=1, buddy_system=False)
