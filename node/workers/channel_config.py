"""How the gateway's connections to a worker are set up: liveness (keepalive) and TLS, for both transports.

Built once at start from ``WorkerPoolConfig`` (``from_pool``): TLS files are read there, so a missing or
broken file stops the start with the file named, and their contents are never logged or shown (``repr``
leaves them out).

TLS (``grpcs://`` URLs): the worker's certificate chain is verified against ``ca_file`` (empty: the system's
trust store) and must name the host of the URL, or ``server_name`` when set (workers addressed by IP whose
certificates carry DNS names). With ``cert_file``/``key_file`` the gateway presents a client certificate
(mutual TLS). The h2 transport offers ALPN ``h2``, as gRPC servers require.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from node.workers.h2_keepalive import KeepaliveConfig

if TYPE_CHECKING:
    from node.config import WorkerPoolConfig

#: TLS 1.2 is the oldest version gRPC servers (grpc core, vLLM) speak; older ones have known breaks.
MIN_TLS_VERSION = ssl.TLSVersion.TLSv1_2


class WorkerTlsError(ValueError):
    """A worker TLS file is missing or unusable; the message names the setting and the file."""


@dataclass(frozen=True, slots=True)
class WorkerTls:
    """PEM material for ``grpcs://`` workers (None: not configured)."""

    ca_pem: bytes | None = field(default=None, repr=False)
    cert_pem: bytes | None = field(default=None, repr=False)
    key_pem: bytes | None = field(default=None, repr=False)
    server_name: str = ""
    #: The files, for building ssl contexts (which load from paths); shown instead of the contents.
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""

    @classmethod
    def load(cls, *, ca_file: str, cert_file: str, key_file: str, server_name: str) -> WorkerTls:
        """Read the files. Raises WorkerTlsError naming the setting and the file."""
        if bool(cert_file) != bool(key_file):
            raise WorkerTlsError("worker_tls_cert_file and worker_tls_key_file: set both (mutual TLS) or neither")
        tls = cls(
            ca_pem=_read("worker_tls_ca_file", ca_file),
            cert_pem=_read("worker_tls_cert_file", cert_file),
            key_pem=_read("worker_tls_key_file", key_file),
            server_name=server_name,
            ca_file=ca_file,
            cert_file=cert_file,
            key_file=key_file,
        )
        tls.ssl_context()  # fail at start, not at the first connection
        return tls

    def ssl_context(self) -> ssl.SSLContext:
        """The h2 transport's client context. Raises WorkerTlsError on unusable material."""
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        context.minimum_version = MIN_TLS_VERSION
        context.set_alpn_protocols(["h2"])
        try:
            if self.ca_pem is not None:
                context = _with_ca(context, self.ca_pem)
            if self.cert_file:
                context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError, ValueError) as exc:
            raise WorkerTlsError(f"worker TLS files ({self.ca_file or self.cert_file}): unusable: {exc}") from None
        return context

    def grpc_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca_pem, private_key=self.key_pem, certificate_chain=self.cert_pem
        )


def _with_ca(context: ssl.SSLContext, ca_pem: bytes) -> ssl.SSLContext:
    """``context`` trusting only ``ca_pem`` (not the system store as well)."""
    fresh = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    fresh.minimum_version = context.minimum_version
    fresh.set_alpn_protocols(["h2"])
    fresh.load_verify_locations(cadata=ca_pem.decode("ascii", errors="replace"))
    return fresh


def _read(name: str, path: str) -> bytes | None:
    if not path:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise WorkerTlsError(f"{name} {path}: {exc.strerror or exc}") from None


@dataclass(frozen=True, slots=True)
class ChannelConfig:
    """Everything a worker client needs to connect, besides the URL."""

    keepalive: KeepaliveConfig = field(default_factory=KeepaliveConfig)
    #: grpc.aio's keepalive_time: it PINGs this often whatever the traffic; gRPC servers refuse pings more
    #: often than their min_recv_ping_interval_without_data (vLLM's: 10 s) unless they sent data in between.
    grpc_keepalive_s: float = 10.0
    tls: WorkerTls = field(default_factory=WorkerTls)

    @classmethod
    def from_pool(cls, config: WorkerPoolConfig) -> ChannelConfig:
        """Raises WorkerTlsError when a TLS file is missing or unusable."""
        return cls(
            keepalive=KeepaliveConfig(
                ping_after_s=config.worker_ping_after_s,
                timeout_s=config.worker_ping_timeout_s,
                idle_timeout_s=config.worker_idle_timeout_s,
            ),
            grpc_keepalive_s=config.worker_keepalive_s,
            tls=WorkerTls.load(
                ca_file=config.worker_tls_ca_file,
                cert_file=config.worker_tls_cert_file,
                key_file=config.worker_tls_key_file,
                server_name=config.worker_tls_server_name,
            ),
        )

    def grpc_options(self, max_message_bytes: int, *, ping_without_calls: bool = True) -> list[tuple[str, int | str]]:
        """grpc.aio channel options with the same liveness as the h2 transport. ``ping_without_calls``: the
        channel carries the health checks (every interval), so pinging it between calls too is allowed by
        the worker and finds a dead path before the next request does; without them (they go over the h2
        connection) an idle channel's pings draw ENHANCE_YOUR_CALM ("too_many_pings") GOAWAYs."""
        keepalive = self.keepalive
        options: list[tuple[str, int | str]] = [
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.keepalive_time_ms", int(self.grpc_keepalive_s * 1000)),
            ("grpc.keepalive_timeout_ms", int(keepalive.timeout_s * 1000)),
            # grpc core (>= 1.5x) waits for any PING's ACK this long before failing the connection, whatever
            # keepalive_timeout says (its default, a minute, would let a stream hang that long).
            ("grpc.http2.ping_timeout_ms", int(keepalive.timeout_s * 1000)),
            # Workers must permit it (vLLM's server does) while the channel carries the health checks.
            ("grpc.keepalive_permit_without_calls", 1 if ping_without_calls else 0),
            # grpc's default (2) stops pinging a long server stream, whose client sends nothing after the
            # request: unlimited, so a Generate stream over grpc.aio also notices a vanished worker.
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.client_idle_timeout_ms", int(keepalive.idle_timeout_s * 1000)),
            # Each node keeps its own channel per worker; let several node processes share nothing by accident.
            ("grpc.use_local_subchannel_pool", 1),
        ]
        if self.tls.server_name:
            options.append(("grpc.ssl_target_name_override", self.tls.server_name))
        return options
