"""Real certificates made for each test session (a CA, a server certificate for 127.0.0.1 and localhost, a client
certificate, and an unrelated CA an attacker might use), and token files."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

TOKEN = "user-token-3f9c2a"
ADMIN_TOKEN = "admin-token-81d0e7"


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    rogue_ca: Path
    rogue_client_cert: Path
    rogue_client_key: Path
    token: Path
    admin_token: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write(folder: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> tuple[Path, Path]:
    cert_path, key_path = folder / f"{stem}.pem", folder / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def _certificate(subject: str, issuer: x509.Name, issuer_key, key, *, ca: bool, usage=None, names=()) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
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


def _authority(folder: Path, stem: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _certificate(stem, _name(stem), key, key, ca=True)
    return cert, key, _write(folder, stem, cert, key)[0]


def _leaf(folder: Path, stem: str, ca: x509.Certificate, ca_key, usage, names=()) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    return _write(folder, stem, _certificate(stem, ca.subject, ca_key, key, ca=False, usage=usage, names=names), key)


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    folder = tmp_path_factory.mktemp("pki")
    ca, ca_key, ca_path = _authority(folder, "test-ca")
    rogue, rogue_key, rogue_path = _authority(folder, "rogue-ca")
    names = (x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
    server_cert, server_key = _leaf(folder, "server", ca, ca_key, ExtendedKeyUsageOID.SERVER_AUTH, names)
    client_cert, client_key = _leaf(folder, "client", ca, ca_key, ExtendedKeyUsageOID.CLIENT_AUTH)
    rogue_cert, rogue_client_key = _leaf(folder, "rogue-client", rogue, rogue_key, ExtendedKeyUsageOID.CLIENT_AUTH)
    token, admin = folder / "token", folder / "admin-token"
    token.write_text(TOKEN + "\n")
    admin.write_text(ADMIN_TOKEN + "\n")
    return Pki(ca_path, server_cert, server_key, client_cert, client_key, rogue_path, rogue_cert, rogue_client_key,
               token, admin)


BUILTIN_TOOLS = Path(__file__).resolve().parents[2] / "agentloop_grpc" / "tools" / "builtin.yaml"
