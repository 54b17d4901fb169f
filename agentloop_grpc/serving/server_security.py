"""Server-side security: TLS (optionally requiring client certificates) and bearer tokens checked on every RPC but
health.

``ServerSecurity`` names where the certificate, key and tokens are (files, environment variables), never the
secrets. ``AuthInterceptor`` answers a call without a token UNAUTHENTICATED, with a wrong token UNAUTHENTICATED,
and a control call (``common.auth.CONTROL_METHODS``, Abort(all)) made with the user token
PERMISSION_DENIED when an admin token is configured; the call's handler never runs, so nothing changes.
``bind`` listens with TLS when configured and warns when a non-loopback address is exposed without a token.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
from pydantic import ConfigDict, Field, model_validator

from agentloop_grpc.common.addresses import is_loopback
from agentloop_grpc.common.auth import ABORT_METHOD, AUTHORIZATION, CONTROL_METHODS, TokenSources

from .handlers import with_behavior

log = logging.getLogger(__name__)

#: Open to everyone: load balancers and launchers check health without credentials.
_OPEN_PREFIX = "/grpc.health.v1.Health/"


class PortInUseError(RuntimeError):
    """The requested address could not be bound."""


class ServerSecurity(TokenSources):
    """TLS and tokens of one server (every field optional: plaintext and open by default)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cert_file: str | None = Field(None, description="PEM server certificate (with cert_file and key_file: TLS).")
    key_file: str | None = Field(None, description="PEM private key of cert_file.")
    client_ca_file: str | None = Field(
        None, description="mTLS: require client certificates signed by this PEM CA."
    )

    @model_validator(mode="after")
    def _consistent(self) -> ServerSecurity:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("TLS needs both a certificate and its key (--tls-cert and --tls-key)")
        if self.client_ca_file is not None and self.cert_file is None:
            raise ValueError("client certificates (--tls-client-ca) need TLS (--tls-cert and --tls-key)")
        return self

    @property
    def tls(self) -> bool:
        return self.cert_file is not None

    def credentials(self) -> grpc.ServerCredentials | None:
        if not self.tls:
            return None
        pair = (Path(self.key_file).read_bytes(), Path(self.cert_file).read_bytes())
        client_ca = Path(self.client_ca_file).read_bytes() if self.client_ca_file else None
        return grpc.ssl_server_credentials(
            [pair], root_certificates=client_ca, require_client_auth=client_ca is not None
        )

    def interceptor(self, on_refusal: Callable[[str], None] | None = None) -> AuthInterceptor | None:
        """The token check, or None when no token is configured (reads the secrets now: a missing one fails)."""
        user, admin = self.tokens()
        return AuthInterceptor(user, admin, on_refusal) if (user or admin) else None

    def cli_args(self) -> list[str]:
        """The ``agentloop ... serve`` options that give a child server this security."""
        flags = {
            "--tls-cert": self.cert_file, "--tls-key": self.key_file, "--tls-client-ca": self.client_ca_file,
            "--auth-token-file": self.token_file, "--auth-token-env": self.token_env,
            "--admin-token-file": self.admin_token_file, "--admin-token-env": self.admin_token_env,
        }
        return [arg for flag, value in flags.items() if value is not None for arg in (flag, str(value))]


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Checks ``authorization: Bearer <token>`` on every RPC but health (see the module docstring)."""

    def __init__(
        self, token: str | None, admin_token: str | None, on_refusal: Callable[[str], None] | None = None
    ) -> None:
        if not (token or admin_token):
            raise ValueError("an AuthInterceptor needs a token or an admin token")
        self._token = token.encode() if token else None
        self._admin = admin_token.encode() if admin_token else None
        #: Told the status code name of every refused call (the metrics count them).
        self._on_refusal = on_refusal or (lambda code: None)

    def _role(self, metadata: Sequence[tuple[str, str | bytes]] | None) -> str:
        """'admin', 'user', 'none' (no token) or 'invalid' (a token that matches nothing)."""
        value = next((v for k, v in metadata or () if k == AUTHORIZATION), None)
        if value is None:
            return "none"
        value = value.encode() if isinstance(value, str) else value
        scheme, _, presented = value.partition(b" ")
        if scheme.lower() != b"bearer" or not presented:
            return "invalid"
        # both comparisons always run, in constant time, so timing tells nothing about either token
        is_admin = self._admin is not None and hmac.compare_digest(presented, self._admin)
        is_user = self._token is not None and hmac.compare_digest(presented, self._token)
        return "admin" if is_admin else "user" if is_user else "invalid"

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        method = handler_call_details.method
        if method.startswith(_OPEN_PREFIX):
            return await continuation(handler_call_details)
        role = self._role(handler_call_details.invocation_metadata)
        handler = await continuation(handler_call_details)
        if handler is None:  # an unknown method: gRPC answers UNIMPLEMENTED
            return None
        if role == "invalid":
            return self._deny(handler, grpc.StatusCode.UNAUTHENTICATED, "the bearer token is not valid")
        if role == "none" and self._token is not None:
            return self._deny(handler, grpc.StatusCode.UNAUTHENTICATED,
                              f"this server requires a bearer token (metadata '{AUTHORIZATION}: Bearer <token>')")
        if role == "admin" or self._admin is None:
            return handler
        # no token at all is UNAUTHENTICATED; the user token where the admin one is needed, PERMISSION_DENIED
        refusal = grpc.StatusCode.UNAUTHENTICATED if role == "none" else grpc.StatusCode.PERMISSION_DENIED
        if method in CONTROL_METHODS:
            return self._deny(handler, refusal, f"{method} needs the admin token")
        if method == ABORT_METHOD:
            return self._guard_abort_all(handler, refusal)
        return handler

    def _deny(self, handler: grpc.RpcMethodHandler, code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
        self._on_refusal(code.name)

        async def refuse(_request: object, context: grpc.aio.ServicerContext) -> None:
            await context.abort(code, message)

        return with_behavior(handler, refuse)

    def _guard_abort_all(self, handler: grpc.RpcMethodHandler, refusal: grpc.StatusCode) -> grpc.RpcMethodHandler:
        behavior = handler.unary_unary

        async def abort(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if request.all:
                self._on_refusal(refusal.name)
                await context.abort(refusal, "Abort(all) needs the admin token")
            return await behavior(request, context)

        return with_behavior(handler, abort)


def bind(server: grpc.aio.Server, address: str, security: ServerSecurity | None = None, exposes: str = "") -> int:
    """Listen on ``address`` (with TLS when ``security`` has a certificate); return the port (the chosen one for
    port 0). Warns when a non-loopback address is open to anyone, saying what ``exposes`` (what a caller can do)."""
    security = security or ServerSecurity()
    # a token or a client certificate authenticates the caller; TLS alone only the server
    authenticated = security.client_ca_file is not None or security.has_token
    if not is_loopback(address):
        if not authenticated:
            log.warning("listening on %s WITHOUT AUTHENTICATION: anyone who reaches this port can %s. Give a token "
                        "(--auth-token-file/--auth-token-env, --admin-token-file) and TLS (--tls-cert, --tls-key).",
                        address, exposes or "call every RPC")
        elif not security.tls:  # (a client CA implies TLS)
            log.warning("listening on %s without TLS: tokens and data cross the network in plaintext "
                        "(--tls-cert, --tls-key).", address)
    try:
        credentials = security.credentials()
        if credentials is None:
            return server.add_insecure_port(address)
        return server.add_secure_port(address, credentials)
    except RuntimeError as exc:  # grpc raises RuntimeError("Failed to bind ...")
        raise PortInUseError(f"cannot listen on {address}: the port is in use or the address is invalid") from exc

