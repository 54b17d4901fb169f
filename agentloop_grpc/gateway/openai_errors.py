"""A GatewayError in OpenAI's error shape, shared by its two formats (Chat Completions and Responses): the type from
the HTTP status, the gateway's ``kind`` as the ``code``."""

from __future__ import annotations

from typing import Any

from .exchange import GatewayError

#: GatewayError.status -> OpenAI's error type; any other status is the server's: ``server_error``.
OPENAI_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    431: "invalid_request_error",
}


def openai_error(error: GatewayError) -> dict[str, Any]:
    """The error body OpenAI's APIs answer with (its HTTP status is ``error.status``)."""
    return {"error": {"message": error.message, "type": OPENAI_ERROR_TYPES.get(error.status, "server_error"),
                      "param": error.param, "code": error.kind}}
