"""Throwaway X.509 material for mutual-TLS tests: a CA and the node certificates it signs, as PEM files.

ECDSA P-256 (instant to generate). Node certificates name a DNS host that nothing resolves, never the IP
the member listens on: the mesh checks the chain, not the name, and the tests rely on that.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=1)


@dataclass(frozen=True, slots=True)
class TlsFiles:
    cert: Path
    key: Path
    ca: Path

    def mesh_fields(self) -> dict[str, str]:
        """The MeshConfig fields that use these files."""
        return {"tls_cert_file": str(self.cert), "tls_key_file": str(self.key), "tls_ca_file": str(self.ca)}


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> Path:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    path.chmod(0o600)
    return path


class CertAuthority:
    """A self-signed CA whose certificate is written to ``directory/<name>-ca.crt``."""

    def __init__(self, directory: Path, name: str) -> None:
        self.directory = directory
        self.name = name
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        subject = _name(f"{name} mesh CA")
        public = self._key.public_key()
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        self.cert_file = directory / f"{name}-ca.crt"
        self.cert_file.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, node: str, *, hosts: Sequence[str] = (), uris: Sequence[str] = ()) -> TlsFiles:
        """A certificate for ``node`` (usable as TLS server and client), its key, and this CA's file.
        ``hosts``: names or IP addresses it is also valid for (an HTTPS server's), beside the unresolvable
        mesh name. ``uris``: URI alternative names (a SPIFFE id)."""
        names: list[x509.GeneralName] = [x509.DNSName(f"{node}.mesh.invalid")]
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        names += [x509.UniformResourceIdentifier(uri) for uri in uris]
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        ca_public = self._key.public_key()
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(node))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_public), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        cert_file = self.directory / f"{self.name}-{node}.crt"
        cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_file = _write_key(self.directory / f"{self.name}-{node}.key", key)
        return TlsFiles(cert=cert_file, key=key_file, ca=self.cert_file)
