"""Worker discovery's config (a leaf: node/config.py imports it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from node.discovery.dns_wire import check_name


@dataclass(frozen=True, slots=True)
class DnsTarget:
    name: str
    port: int | None  # None: SRV records give the ports

    @classmethod
    def parse(cls, text: str) -> DnsTarget:
        """``NAME:PORT`` or ``NAME``; raises ValueError naming the problem."""
        name, sep, port = text.rpartition(":")
        if not sep:
            name, port = text, ""
        name = name.rstrip(".").lower()
        check_name(name)
        if not port:
            return cls(name, None)
        if not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ValueError(f"worker DNS target {text!r}: the port must be in 1..65535")
        return cls(name, int(port))

    def __str__(self) -> str:
        return self.name if self.port is None else f"{self.name}:{self.port}"


@dataclass(frozen=True, slots=True)
class DiscoveryConfig:
    worker_dns: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "workers by DNS: NAME:PORT (every A/AAAA address of NAME, e.g. a headless Service) or NAME "
            "(its SRV records); fully qualified, re-resolved every --worker-dns-interval-s, added to and "
            "removed from the cluster's workers",
            "metavar": "NAME[:PORT]",
        },
    )
    worker_dns_server: str = field(
        default="",
        metadata={"help": "DNS server HOST:PORT to ask (default: the first nameserver of /etc/resolv.conf)"},
    )
    worker_dns_interval_s: float = field(default=10.0, metadata={"help": "how often worker DNS names are resolved"})
    worker_dns_timeout_s: float = field(default=2.0, metadata={"help": "one DNS query's deadline"})

    def __post_init__(self) -> None:
        for text in self.worker_dns:
            try:
                DnsTarget.parse(text)
            except ValueError as exc:
                raise ValueError(f"worker_dns: {exc}") from exc
        if self.worker_dns_server:
            self.server()
        if self.worker_dns_interval_s <= 0 or self.worker_dns_timeout_s <= 0:
            raise ValueError("worker_dns_interval_s and worker_dns_timeout_s must be > 0")

    def targets(self) -> tuple[DnsTarget, ...]:
        return tuple(DnsTarget.parse(t) for t in self.worker_dns)

    def server(self) -> tuple[str, int] | None:
        """The configured server (None: resolv.conf's). Raises ValueError on a bad HOST:PORT."""
        if not self.worker_dns_server:
            return None
        host, sep, port = self.worker_dns_server.rpartition(":")
        if not sep or not port.isdigit() or not 1 <= int(port) <= 65535 or not host:
            raise ValueError(f"worker_dns_server must be HOST:PORT, got {self.worker_dns_server!r}")
        return host.strip("[]"), int(port)
