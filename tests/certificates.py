"""Real X.509 certificates for tests: a CA (``authority``) and certificates it signs (``leaf``), written as PEM
files; used by the TLS tests on loopback (tests/security) and by the cluster's certificates naming its nodes
(tests/cluster)."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


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


def authority(folder: Path, stem: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey, Path]:
    """A self-signed CA named ``stem``: its certificate, its key, and the PEM file of the certificate."""
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _certificate(stem, _name(stem), key, key, ca=True)
    return cert, key, _write(folder, stem, cert, key)[0]


def leaf(folder: Path, stem: str, ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey,
         usage: x509.ObjectIdentifier, names: Sequence[x509.GeneralName] = ()) -> tuple[Path, Path]:
    """A certificate ``ca`` signs for ``usage`` (server or client auth), naming ``names``: its PEM and key files."""
    key = ec.generate_private_key(ec.SECP256R1())
    return _write(folder, stem, _certificate(stem, ca.subject, ca_key, key, ca=False, usage=usage, names=names), key)
