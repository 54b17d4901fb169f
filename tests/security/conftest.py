"""Real certificates made for each test session (a CA, a server certificate for 127.0.0.1 and localhost, a client
certificate, and an unrelated CA an attacker might use), and token files."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from ..certificates import authority, leaf

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


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    folder = tmp_path_factory.mktemp("pki")
    ca, ca_key, ca_path = authority(folder, "test-ca")
    rogue, rogue_key, rogue_path = authority(folder, "rogue-ca")
    names = (x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
    server_cert, server_key = leaf(folder, "server", ca, ca_key, ExtendedKeyUsageOID.SERVER_AUTH, names)
    client_cert, client_key = leaf(folder, "client", ca, ca_key, ExtendedKeyUsageOID.CLIENT_AUTH)
    rogue_cert, rogue_client_key = leaf(folder, "rogue-client", rogue, rogue_key, ExtendedKeyUsageOID.CLIENT_AUTH)
    token, admin = folder / "token", folder / "admin-token"
    token.write_text(TOKEN + "\n")
    admin.write_text(ADMIN_TOKEN + "\n")
    return Pki(ca_path, server_cert, server_key, client_cert, client_key, rogue_path, rogue_cert, rogue_client_key,
               token, admin)


BUILTIN_TOOLS = Path(__file__).resolve().parents[2] / "agentloop_grpc" / "tools" / "builtin.yaml"
