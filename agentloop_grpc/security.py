"""Client-side security: TLS that verifies the server (and shows a client certificate for mTLS) and the bearer
tokens sent with every call.

A config names where each secret is (a file, or an environment variable), never the secret itself, so configs
can be written to discovery files, YAML and logs. The admin token goes with control calls (UpdateWeights, Sleep,
WakeUp, Pause, Resume, FlushCache, Abort(all)); every other call carries the user token (or the admin token when
no user token is given: a server accepts its admin token wherever it accepts the user token).
"""

from __future__ import annotations

import os
from pathlib import Path

import grpc
from pydantic import BaseModel, ConfigDict, Field, model_validator

#: The metadata key of the bearer token (lower case, as HTTP/2 requires).
AUTHORIZATION = "authorization"

#: RPCs that change what a server does for every caller: they need the admin token where one is configured.
CONTROL_METHODS = frozenset(
    f"/agentloop.v1.EngineControl/{name}"
    for name in (
        "Sleep", "WakeUp", "Pause", "Resume", "UpdateWeights", "LoadWeights", "JoinWeightGroup", "ReceiveWeights",
        "LeaveWeightGroup", "FlushCache",
    )
)
#: Abort is a control call only when it aborts every request (``AbortRequest.all``).
ABORT_METHOD = "/agentloop.v1.TokenGenerate/Abort"


def read_secret(file: str | None, env: str | None, what: str) -> str | None:
    """The secret in ``file`` (stripped) or in environment variable ``env``; None when neither is given."""
    if file is not None and env is not None:
        raise ValueError(f"{what}: give a file or an environment variable, not both")
    if file is not None:
        value = Path(file).read_text().strip()
        if not value:
            raise ValueError(f"{what}: the file {file} is empty")
        return value
    if env is not None:
        value = os.environ.get(env, "").strip()
        if not value:
            raise ValueError(f"{what}: the environment variable {env} is not set")
        return value
    return None


def is_control_call(method: str, request: object | None) -> bool:
    """Whether ``method`` (``/package.Service/Method``) with ``request`` is a control call."""
    return method in CONTROL_METHODS or (method == ABORT_METHOD and bool(getattr(request, "all", False)))


class ClientSecurity(BaseModel):
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
    token_file: str | None = Field(None, description="File holding the bearer token sent with every call.")
    token_env: str | None = Field(None, description="Environment variable holding the bearer token.")
    admin_token_file: str | None = Field(None, description="File holding the admin token sent with control calls.")
    admin_token_env: str | None = Field(None, description="Environment variable holding the admin token.")

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
        if self.token_file is not None and self.token_env is not None:
            raise ValueError("security: give token_file or token_env, not both")
        if self.admin_token_file is not None and self.admin_token_env is not None:
            raise ValueError("security: give admin_token_file or admin_token_env, not both")
        return self

    def credentials(self) -> grpc.ChannelCredentials | None:
        """TLS credentials, or None for a plaintext channel."""
        if not self.tls:
            return None
        read = lambda path: Path(path).read_bytes() if path else None  # noqa: E731
        return grpc.ssl_channel_credentials(read(self.ca_file), read(self.key_file), read(self.cert_file))

    def tokens(self) -> tuple[str | None, str | None]:
        """(user token, admin token) as read now; a missing file or variable is a ValueError."""
        return (read_secret(self.token_file, self.token_env, "token"),
                read_secret(self.admin_token_file, self.admin_token_env, "admin token"))


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


class _UnaryUnary(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self, tokens: _Tokens) -> None:
        self._tokens = tokens

    async def intercept_unary_unary(self, continuation, client_call_details, request):
        return await continuation(self._tokens.details(client_call_details, request), request)


class _UnaryStream(grpc.aio.UnaryStreamClientInterceptor):
    def __init__(self, tokens: _Tokens) -> None:
        self._tokens = tokens

    async def intercept_unary_stream(self, continuation, client_call_details, request):
        return await continuation(self._tokens.details(client_call_details, request), request)


class _StreamUnary(grpc.aio.StreamUnaryClientInterceptor):
    def __init__(self, tokens: _Tokens) -> None:
        self._tokens = tokens

    async def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        return await continuation(self._tokens.details(client_call_details, None), request_iterator)


class _StreamStream(grpc.aio.StreamStreamClientInterceptor):
    def __init__(self, tokens: _Tokens) -> None:
        self._tokens = tokens

    async def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return await continuation(self._tokens.details(client_call_details, None), request_iterator)


def token_interceptors(user: str | None, admin: str | None) -> list[grpc.aio.ClientInterceptor]:
    """Client interceptors adding ``authorization: Bearer ...`` to every call (one per call kind: grpc.aio files
    an interceptor under its first matching kind only)."""
    tokens = _Tokens(user, admin)
    return [_UnaryUnary(tokens), _UnaryStream(tokens), _StreamUnary(tokens), _StreamStream(tokens)]
