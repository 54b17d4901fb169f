"""Client channels to our servers: keepalive on every one, TLS and tokens where a ``ClientSecurity`` says so."""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from .client_security import ClientSecurity, token_interceptors

_PING_AFTER_MS = 5_000
_PING_TIMEOUT_MS = 5_000
KEEPALIVE_OPTIONS = (
    # a ping after this long without data from the server, and the connection closed when its answer is late:
    # a hung server's calls fail (and the Router's fail over) instead of waiting out their deadlines
    ("grpc.keepalive_time_ms", _PING_AFTER_MS),
    ("grpc.keepalive_timeout_ms", _PING_TIMEOUT_MS),
    # grpcio waits this long for a keepalive ping's answer, whatever keepalive_timeout_ms says
    ("grpc.http2.ping_timeout_ms", _PING_TIMEOUT_MS),
    # pings also while no call is open, and with no data sent: a health watch sends nothing for hours
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
)


def open_channel(
    address: str, security: ClientSecurity | None = None, options: Sequence[tuple[str, object]] = ()
) -> grpc.aio.Channel:
    """An asyncio channel to ``address`` with keepalive and, per ``security``, TLS and tokens."""
    options = [*KEEPALIVE_OPTIONS, *options]
    if security is None:
        return grpc.aio.insecure_channel(address, options=options)
    if security.server_name:
        options.append(("grpc.ssl_target_name_override", security.server_name))
    user, admin = security.tokens()
    interceptors = token_interceptors(user, admin) if (user or admin) else None
    credentials = security.credentials()
    if credentials is None:
        return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)
    return grpc.aio.secure_channel(address, credentials, options=options, interceptors=interceptors)
