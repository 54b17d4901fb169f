"""The security of the servers a launcher starts, from what one server is given (``agentloop engine launch``'s
``--tls-*`` and token options): their paths made absolute, since a server runs in another folder or on another node,
and the ``ClientSecurity`` that reaches them (the launcher's health checks; the discovery file tells routers)."""

from __future__ import annotations

from pathlib import Path

from agentloop_grpc.client_security import ClientSecurity
from agentloop_grpc.serving.server_security import ServerSecurity

_PATHS = ("cert_file", "key_file", "client_ca_file", "token_file", "admin_token_file")


def _absolute(path: str | None) -> str | None:
    return str(Path(path).absolute()) if path else None


def launch_security(
    server: ServerSecurity, ca_file: str | None = None, client_cert: str | None = None, client_key: str | None = None
) -> tuple[ServerSecurity | None, ClientSecurity | None]:
    """(each server's security, how clients reach them); (None, None) for open servers. ``ca_file``: the CA that
    signed ``server.cert_file`` (default: that certificate, when self-signed); ``client_cert`` and ``client_key``:
    the certificate clients show for mTLS. A bad combination raises ValueError."""
    server = server.model_copy(update={name: _absolute(getattr(server, name)) for name in _PATHS})
    client = ClientSecurity(
        tls=server.tls, ca_file=_absolute(ca_file) or server.cert_file, cert_file=_absolute(client_cert),
        key_file=_absolute(client_key), token_file=server.token_file, token_env=server.token_env,
        admin_token_file=server.admin_token_file, admin_token_env=server.admin_token_env,
    )
    if client == ClientSecurity():
        return None, None
    return server, client
