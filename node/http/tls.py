"""HTTPS for clients: the server's TLS context from certificate and key files, optional client certificates
(mutual TLS), and reloading the files into the *live* context (SIGHUP): connections already open keep their
session, new handshakes present the new certificate; nothing is dropped.

A reload first loads the files into a scratch context, so a half-written or mismatched pair is logged and
changes nothing (the node keeps serving its current certificate).
"""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass

log = logging.getLogger(__name__)


class TlsFilesError(ValueError):
    """The certificate, key or client CA files cannot be used; the message names the file."""


@dataclass(frozen=True, slots=True)
class TlsFiles:
    cert: str
    key: str
    client_ca: str = ""


def _load(context: ssl.SSLContext, files: TlsFiles) -> None:
    """Raises TlsFilesError naming the file."""
    try:
        context.load_cert_chain(files.cert, files.key)
    except (OSError, ssl.SSLError) as exc:
        raise TlsFilesError(f"TLS certificate {files.cert} / key {files.key}: {exc}") from None
    if files.client_ca:
        try:
            context.load_verify_locations(cafile=files.client_ca)
        except (OSError, ssl.SSLError) as exc:
            raise TlsFilesError(f"TLS client CA {files.client_ca}: {exc}") from None


def _fresh(files: TlsFiles) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if files.client_ca:
        context.verify_mode = ssl.CERT_REQUIRED
    _load(context, files)
    return context


class ServerTls:
    """The listening socket's context and its reload."""

    def __init__(self, files: TlsFiles) -> None:
        """Raises TlsFilesError."""
        self.files = files
        self.context = _fresh(files)
        self.reloads = 0

    def reload(self) -> bool:
        """Re-read the files into the live context; False (logged, nothing changed) if they do not load."""
        try:
            _fresh(self.files)  # the check: a scratch context
            _load(self.context, self.files)
        except TlsFilesError as exc:
            log.error("TLS files not reloaded, still serving the previous certificate: %s", exc)
            return False
        self.reloads += 1
        log.info("TLS certificate %s reloaded", self.files.cert)
        return True
