"""Client-side security: TLS that verifies the server (and shows a client certificate for mTLS) and the bearer
tokens sent with every call.

A config names where each secret is (``common.auth.TokenSources``). The admin token goes with control calls
(``common.auth.CONTROL_METHODS``: weight updates and weight groups, Sleep, WakeUp, Pause, Resume, FlushCache, and
Abort(all)); every other call carries the user token (or the admin token when no user token is given: a server
accepts its admin token wherever it accepts the user token).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from pydantic import ConfigDict, Field, model_validator

from agentloop_grpc.common.auth import AUTHORIZATION, TokenSources, is_control_call


class ClientSecurity(TokenSources):
    """How a client reaches servers that require TLS and/or tokens (every field optional: plain by default)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tls: bool = Field(False, description="Connect with TLS (implied by ca_file or cert_file).")
    ca_file: str | None = Field(
        None, description="PEM file of the CA that signed the servers' certificates (default: the system's roots)."
    )
    cert_file: str | None = Field(None, description="mTLS: PEM client certificate shown to the server.")
    key_file: str | None = Field(None, description="mTLS: PEM private key of cert_file.")
    server_name: str | None = Field(
        None, description="Check the server certificate against this name instead of the address's host."
    )

    @model_validator(mode="before")
    @classmethod
    def _tls_implied(cls, data: object) -> object:
        if isinstance(data, dict) and any(data.get(k) for k in ("ca_file", "cert_file", "server_name")):
            return {**data, "tls": True}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> ClientSecurity:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("security: cert_file and key_file go together (the client certificate for mTLS)")
        return self

    def credentials(self) -> grpc.ChannelCredentials | None:
        """TLS credentials, or None for a plaintext channel."""
        if not self.tls:
            return None
        read = lambda path: Path(path).read_bytes() if path else None  # noqa: E731
        return grpc.ssl_channel_credentials(read(self.ca_file), read(self.key_file), read(self.cert_file))


class _Tokens:
    """Picks the token of each call: the admin token for control calls, the user token for the rest."""

    def __init__(self, user: str | None, admin: str | None) -> None:
        self._user = (AUTHORIZATION, f"Bearer {user or admin}")
        self._admin = (AUTHORIZATION, f"Bearer {admin or user}")

    def details(self, details: grpc.aio.ClientCallDetails, request: object | None) -> grpc.aio.ClientCallDetails:
        method = details.method.decode() if isinstance(details.method, bytes) else details.method
        header = self._admin if is_control_call(method, request) else self._user
        metadata = grpc.aio.Metadata(*(details.metadata or ()))
        metadata.add(*header)
        return details._replace(metadata=metadata)


# One subclass per call kind, each adding the header to its kind's calls (a stream's messages are not read).
class _UnaryUnary(_Tokens, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(
        self, continuation: Callable[..., Any], client_call_details: grpc.aio.ClientCallDetails, request: Any
    ) -> Any:
        return await continuation(self.details(client_call_details, request), request)


class _UnaryStream(_Tokens, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(
        self, continuation: Callable[..., Any], client_call_details: grpc.aio.ClientCallDetails, request: Any
    ) -> Any:
        return await continuation(self.details(client_call_details, request), request)


class _StreamUnary(_Tokens, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(
        self, continuation: Callable[..., Any], client_call_details: grpc.aio.ClientCallDetails, request_iterator: Any
    ) -> Any:
        return await continuation(self.details(client_call_details, None), request_iterator)


class _StreamStream(_Tokens, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(
        self, continuation: Callable[..., Any], client_call_details: grpc.aio.ClientCallDetails, request_iterator: Any
    ) -> Any:
        return await continuation(self.details(client_call_details, None), request_iterator)


def token_interceptors(user: str | None, admin: str | None) -> list[grpc.aio.ClientInterceptor]:
    """Client interceptors adding ``authorization: Bearer ...`` to every call (one per call kind: grpc.aio files
    an interceptor under its first matching kind only)."""
    return [kind(user, admin) for kind in (_UnaryUnary, _UnaryStream, _StreamUnary, _StreamStream)]
