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
    worker_k8s_selector: str = field(
        default="",
        metadata={
            "help": "workers by Kubernetes labels: a pod label selector (e.g. app=vllm); every Running, Ready "
            "pod it matches is a worker, watched through the API server"
        },
    )
    worker_k8s_namespace: str = field(
        default="", metadata={"help": "namespace of the worker pods (default: this pod's own)"}
    )
    worker_k8s_port: int = field(default=50051, metadata={"help": "the worker pods' gRPC port"})
    worker_k8s_model_key: str = field(
        default="smg.ai/model", metadata={"help": "pod label or annotation naming the model a worker serves"}
    )
    worker_k8s_api_url: str = field(
        default="https://kubernetes.default.svc", metadata={"help": "the Kubernetes API server"}
    )
    worker_k8s_service_account_dir: str = field(
        default="/var/run/secrets/kubernetes.io/serviceaccount",
        metadata={"help": "where the pod's token, ca.crt and namespace are mounted", "metavar": "DIR"},
    )

    def __post_init__(self) -> None:
        for text in self.worker_dns:
            try:
                DnsTarget.parse(text)
            except ValueError as exc:
                raise ValueError(f"worker_dns: {exc}") from exc
        if self.worker_dns_server:
            self.server()
        if not 1 <= self.worker_k8s_port <= 65535:
            raise ValueError(f"worker_k8s_port must be in 1..65535, got {self.worker_k8s_port}")
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
