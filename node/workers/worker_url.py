"""Worker URLs (``grpc://host:port``, ``grpcs://host:port`` for TLS) and which networks they may point into.

Pure: no I/O, no DNS. A worker URL names where the gateway opens connections, so a registration is an
instruction to connect somewhere; validation keeps it to exactly one spelling of a host and port:
- scheme ``grpc`` or ``grpcs``; host a DNS name or an IP literal (IPv6 in brackets); port 1..65535, explicit;
- no userinfo, path, query or fragment (none has a meaning for a gRPC target, and each would give one
  worker a second URL, hence a second id);
- an IP literal must lie outside the link-local and cloud-metadata ranges unless the operator allows them,
  and inside the allowed networks when some are configured (``NetworkPolicy``). Here names are checked by
  syntax only; every address a name resolves to is held to the same policy by ``worker_address``, at
  registration and before each connection.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

SCHEMES = ("grpc", "grpcs")
#: RFC 1035 limits; underscores are accepted in labels because container runtimes' service names use them and
#: their resolvers answer for them.
MAX_HOSTNAME_CHARS = 253
_LABEL = re.compile(r"^(?!-)[A-Za-z0-9_-]{1,63}(?<!-)$")
#: Refused unless allowed explicitly: link-local ranges, which hold the cloud instance-metadata services
#: (169.254.169.254 on every major cloud, fd00:ec2::254 on AWS over IPv6). A worker there is almost surely a
#: typo or an attempt to make the gateway fetch credentials.
DEFAULT_DENIED_NETWORKS: tuple[IpNetwork, ...] = (
    ipaddress.ip_network("169.254.0.0/16"),
    ipaddress.ip_network("fe80::/10"),
    ipaddress.ip_network("fd00:ec2::254/128"),
)


@dataclass(frozen=True, slots=True)
class WorkerTarget:
    """A parsed worker URL. ``authority`` is the gRPC target ``host:port`` (IPv6 bracketed)."""

    host: str
    port: int
    tls: bool
    ip: IpAddress | None  # the host as an address, when it is an IP literal

    @property
    def authority(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def _bad(url: str, why: str) -> ValueError:
    return ValueError(f"worker URL {url!r} {why}; it must look like grpc://host:port or grpcs://host:port")


def parse_target(url: str) -> WorkerTarget:
    """Parse and check the syntax of a worker URL. Raises ValueError naming the URL and what is wrong."""
    if not url.isascii() or any(c.isspace() or not c.isprintable() for c in url):
        raise _bad(url, "has spaces, control or non-ASCII characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:  # a non-numeric or out-of-range port, a broken IPv6 literal
        raise _bad(url, f"is malformed ({exc})") from None
    if parts.scheme not in SCHEMES:
        raise _bad(url, f"has scheme {parts.scheme!r}")
    if "@" in parts.netloc:
        raise _bad(url, "has user information")
    if parts.path or parts.query or parts.fragment or url.endswith(("?", "#")):
        raise _bad(url, "has a path, query or fragment")
    host = parts.hostname or ""
    if not host:
        raise _bad(url, "has no host")
    if port is None or not 1 <= port <= 65535 or not parts.netloc.endswith(f":{port}"):
        raise _bad(url, "needs a port in 1..65535 (in decimal, without leading zeros)")
    bracketed = parts.netloc.startswith("[")
    ip: IpAddress | None
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    if bracketed and (ip is None or ip.version != 6 or "%" in host):
        raise _bad(url, "has a bracketed host that is not an IPv6 address")
    if ip is not None and not bracketed and ip.version == 6:
        raise _bad(url, "has an IPv6 address outside brackets")
    if ip is None and not _is_hostname(host):
        raise _bad(url, f"has host {host!r}, which is neither a hostname nor an IP address")
    if ip is not None and (ip.is_unspecified or ip.is_multicast):
        raise _bad(url, f"has host {host}, which is not a unicast address")
    return WorkerTarget(host=host, port=port, tls=parts.scheme == "grpcs", ip=ip)


def _is_hostname(host: str) -> bool:
    if len(host) > MAX_HOSTNAME_CHARS or host[-1:] == ".":
        return False
    labels = host.split(".")
    return all(_LABEL.match(label) for label in labels) and not labels[-1].isdigit()


def parse_networks(values: tuple[str, ...], what: str) -> tuple[IpNetwork, ...]:
    """CIDRs (or single addresses) to networks. Raises ValueError naming ``what`` and the bad value."""
    out: list[IpNetwork] = []
    for value in values:
        try:
            out.append(ipaddress.ip_network(value.strip(), strict=False))
        except ValueError as exc:
            raise ValueError(f"{what}: {value!r} is not a network in CIDR notation ({exc})") from None
    return tuple(out)


def unmapped(ip: IpAddress) -> IpAddress:
    """``::ffff:a.b.c.d`` is a.b.c.d (it is where the connection goes)."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


@dataclass(frozen=True, slots=True)
class NetworkPolicy:
    """Where worker IP literals may point. ``allowed`` empty: anywhere but the denied ranges; otherwise only
    inside ``allowed``. A denied range is opened only by an allowed network inside it (``169.254.10.0/24``
    opens that part; ``0.0.0.0/0`` opens nothing that is denied)."""

    allowed: tuple[IpNetwork, ...] = ()
    denied: tuple[IpNetwork, ...] = DEFAULT_DENIED_NETWORKS

    def check(self, url: str, target: WorkerTarget) -> None:
        """Raises ValueError when ``target`` (parsed from ``url``) points outside the policy. A name passes:
        what it resolves to is checked by ``check_address`` (``worker_address``)."""
        if target.ip is not None:
            self.check_address(url, target.ip)

    def check_address(self, url: str, address: IpAddress, *, via: str = "") -> None:
        """Raises ValueError when a connection for ``url`` to ``address`` would leave the policy; with ``via``
        (the name ``address`` was resolved from) the message names the address."""
        ip = unmapped(address)
        outside, into = (
            ("points outside", "points into") if not via else (f"resolves to {ip}, outside", f"resolves to {ip}, in")
        )
        inside = [net for net in self.allowed if ip in net]
        if self.allowed and not inside:
            nets = ", ".join(str(net) for net in self.allowed)
            raise ValueError(f"worker URL {url!r} {outside} the allowed worker networks ({nets})")
        denied = [net for net in self.denied if ip in net]
        if any(not any(a.version == d.version and a.subnet_of(d) for a in inside) for d in denied):  # type: ignore[arg-type]
            raise ValueError(
                f"worker URL {url!r} {into} a link-local or metadata range; allow it explicitly with "
                "--worker-allowed-networks if a worker really is there"
            )
