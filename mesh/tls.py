"""Mutual TLS for the mesh's TCP streams (join, push-pull, fallback probe): contexts built once at start.

Trust is "holds a certificate signed by the cluster CA". Both ends present their certificate and require
the peer's (CERT_REQUIRED), and the peer's chain is verified against the CA file alone (the system's
trust store is not loaded). No host name is matched: members are addressed by IP:port and gossip other
members' addresses, so a name in the certificate could not be checked against anything meaningful. A
node certificate is used as a server and as a client, so its extendedKeyUsage (if present) must allow
both serverAuth and clientAuth.

TLS covers streams only; UDP packets are protected by the keyring. With both configured, stream frames
are sealed with the keyring inside the TLS session (defence in depth).
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from mesh.errors import TlsError

#: Every member is smg-node on Python >= 3.11, whose OpenSSL (>= 1.1.1) speaks TLS 1.3: no older peer
#: exists, so nothing older is offered.
MIN_TLS_VERSION = ssl.TLSVersion.TLSv1_3


@dataclass(frozen=True, slots=True)
class TlsContexts:
    """The listener's context (``server``) and the one for outgoing streams (``client``)."""

    server: ssl.SSLContext
    client: ssl.SSLContext

    @classmethod
    def load(cls, cert_file: str, key_file: str, ca_file: str) -> TlsContexts:
        """Read a PEM certificate (chain), its unencrypted PEM private key and the cluster CA's PEM
        certificate(s). Raises TlsError naming the file that is unreadable or invalid."""
        cert_pem = _read("tls_cert_file", cert_file)
        key_pem = _read("tls_key_file", key_file)
        ca_pem = _read("tls_ca_file", ca_file)
        _check_certs("tls_cert_file", cert_file, cert_pem)
        _check_certs("tls_ca_file", ca_file, ca_pem)
        try:
            serialization.load_pem_private_key(key_pem, password=None)
        except TypeError as exc:  # cryptography's way of saying "encrypted, and no password given"
            raise TlsError(f"tls_key_file {key_file}: encrypted private keys are not supported") from exc
        except ValueError as exc:
            raise TlsError(f"tls_key_file {key_file}: not a PEM private key") from exc
        server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        client.check_hostname = False  # see the module docstring; the chain is still verified
        for context in (server, client):
            context.minimum_version = MIN_TLS_VERSION
            context.verify_mode = ssl.CERT_REQUIRED
            try:
                context.load_cert_chain(cert_file, key_file)
            except (OSError, ssl.SSLError) as exc:
                raise TlsError(f"tls_key_file {key_file}: does not match the certificate in {cert_file}") from exc
            try:
                context.load_verify_locations(cadata=ca_pem.decode("ascii", errors="replace"))
            except (ssl.SSLError, ValueError) as exc:
                raise TlsError(f"tls_ca_file {ca_file}: not usable as a CA: {exc}") from exc
        return cls(server=server, client=client)


def _read(name: str, path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise TlsError(f"{name} {path}: {exc.strerror or exc}") from exc


def _check_certs(name: str, path: str, pem: bytes) -> None:
    try:
        x509.load_pem_x509_certificates(pem)
    except ValueError as exc:
        raise TlsError(f"{name} {path}: no PEM certificate in it") from exc


def on_handshake_failure(context: ssl.SSLContext, callback: Callable[[ssl.SSLError], None]) -> None:
    """Call ``callback`` with the error of every handshake over ``context`` that fails: no certificate, one
    that does not verify, not TLS at all. A handshake that times out or whose peer just hangs up is not seen.

    Uses the documented ``SSLContext.sslobject_class`` hook: asyncio's and uvloop's TLS layers both create
    their ``SSLObject`` with ``wrap_bio`` and never hand a failed handshake to the application.
    """

    class _Watched(ssl.SSLObject):
        def do_handshake(self) -> None:
            try:
                super().do_handshake()
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                raise  # not a failure: the handshake waits for more bytes
            except ssl.SSLError as exc:
                callback(exc)
                raise

    context.sslobject_class = _Watched
