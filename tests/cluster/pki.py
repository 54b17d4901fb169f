"""Real certificates for a cluster's servers: a CA, one server certificate naming every node's IP address, a client
certificate (mTLS), and token files. Every server reads the same paths (the nodes share this machine's files)."""

from __future__ import annotations

import ipaddress
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from ..certificates import authority, leaf


@dataclass(frozen=True)
class ClusterPki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    token: Path
    admin_token: Path


def issue(folder: Path, addresses: Sequence[str]) -> ClusterPki:
    """A CA and the certificates of a cluster whose servers listen on ``addresses`` (IPs, named in the server
    certificate's subjectAltName: a client checks the IP it dialled), and fresh random tokens."""
    folder.mkdir(parents=True, exist_ok=True)
    ca, ca_key, ca_path = authority(folder, "cluster-ca")
    names = [x509.IPAddress(ipaddress.ip_address(address)) for address in addresses]
    server_cert, server_key_path = leaf(folder, "server", ca, ca_key, ExtendedKeyUsageOID.SERVER_AUTH, names)
    client_cert, client_key_path = leaf(folder, "client", ca, ca_key, ExtendedKeyUsageOID.CLIENT_AUTH)
    token, admin = folder / "token", folder / "admin-token"
    token.write_text(secrets.token_hex(16) + "\n")
    admin.write_text(secrets.token_hex(16) + "\n")
    return ClusterPki(ca_path, server_cert, server_key_path, client_cert, client_key_path, token, admin)
