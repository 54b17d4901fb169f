"""What a tool server raises on purpose, by the tools' own names.

Each error also derives from the serving layer's error of the same status code (``common/errors.py``), so the
one mapping in ``serving/status.py`` answers it: NOT_FOUND, INVALID_ARGUMENT, RESOURCE_EXHAUSTED.

A refusal for a full server carries ``FULL_METADATA`` in its trailing metadata: a client retries only a call the
server marked so, because nothing of it ran, whereas a RESOURCE_EXHAUSTED gRPC itself raises (a reply larger than
the client takes) may come after the tool did its work, which a retry would do twice.
"""

from __future__ import annotations

from agentloop_grpc.common.errors import (
    EngineError,
    EngineOverloadedError,
    EngineUnavailableError,
    InvalidRequestError,
    NotFoundError,
)

#: Trailing metadata of a refusal that ran nothing because the server was full (key, value).
FULL_METADATA = ("agentloop-tool-server-full", "1")
#: Trailing metadata key of an UNAVAILABLE that a tool's own infrastructure caused; its value is the cause.
INFRASTRUCTURE_METADATA = "agentloop-tool-infrastructure"


class ToolServerError(EngineError):
    """Base of every error a tool server raises on purpose."""


class InvalidToolRequestError(ToolServerError, InvalidRequestError):
    """The request is malformed (INVALID_ARGUMENT): an id over its bound, JSON the decoder cannot take."""


class ToolNotFoundError(ToolServerError, NotFoundError):
    """No such tool or instance (NOT_FOUND): never created, released, or expired."""


class ToolServerFullError(ToolServerError, EngineOverloadedError):
    """A limit is reached (RESOURCE_EXHAUSTED): live instances, or running plus queued executions."""


class ToolBackendError(ToolServerError, EngineUnavailableError):
    """What a tool depends on failed, not the tool's work (UNAVAILABLE, the cause in trailing metadata
    ``INFRASTRUCTURE_METADATA``): an MCP server that crashed, hung past its call timeout or never started. The
    trajectory that made the call is an infrastructure failure, never trained on as the model's mistake.

    ``cause`` is a short name a report counts failures by (``mcp_server_crashed``); the message says the rest."""

    def __init__(self, cause: str, message: str) -> None:
        super().__init__(message)
        self.cause = cause
