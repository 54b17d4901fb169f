"""Real certificates for a cluster's servers: a CA, one server certificate naming every node's IP address, a client
certificate (mTLS), and token files. Every server reads the same paths (the nodes share this machine's files)."""

from __future__ import annotations

import datetime
import ipaddress
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class ClusterPki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    token: Path
    admin_token: Path


def _write(folder: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> tuple[Path, Path]:
    cert_path, key_path = folder / f"{stem}.pem", folder / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_path.chmod(0o600)
    return cert_path, key_path


def _certificate(subject: str, issuer: x509.Name, issuer_key: ec.EllipticCurvePrivateKey,
                 key: ec.EllipticCurvePrivateKey, *, ca: bool, usage: x509.ObjectIdentifier | None = None,
                 names: Sequence[x509.GeneralName] = ()) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(names)), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def issue(folder: Path, addresses: Sequence[str]) -> ClusterPki:
    """A CA and the certificates of a cluster whose servers listen on ``addresses`` (IPs, named in the server
    certificate's subjectAltName: a client checks the IP it dialled), and fresh random tokens."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _certificate("cluster-ca", x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "cluster-ca")]), ca_key,
                      ca_key, ca=True)
    ca_path, _ = _write(folder, "ca", ca, ca_key)
    server_key = ec.generate_private_key(ec.SECP256R1())
    names = [x509.IPAddress(ipaddress.ip_address(address)) for address in addresses]
    server = _certificate("cluster-server", ca.subject, ca_key, server_key, ca=False,
                          usage=ExtendedKeyUsageOID.SERVER_AUTH, names=names)
    server_cert, server_key_path = _write(folder, "server", server, server_key)
    client_key = ec.generate_private_key(ec.SECP256R1())
    client = _certificate("cluster-client", ca.subject, ca_key, client_key, ca=False,
                          usage=ExtendedKeyUsageOID.CLIENT_AUTH)
    client_cert, client_key_path = _write(folder, "client", client, client_key)
    token, admin = folder / "token", folder / "admin-token"
    token.write_text(secrets.token_hex(16) + "\n")
    admin.write_text(secrets.token_hex(16) + "\n")
    return ClusterPki(ca_path, server_cert, server_key_path, client_cert, client_key_path, token, admin)
