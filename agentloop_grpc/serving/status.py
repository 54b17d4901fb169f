"""One place that turns adapter exceptions into gRPC status codes, for unary, client- and server-streaming handlers.

Handlers raise; this decorator aborts the call with the mapped code and the exception's message, cut to
MAX_DETAILS_BYTES. An exception that is not an EngineError is an engine bug: it is logged with its traceback and
reported as INTERNAL, and the server stays up.

The cut keeps every code intact: gRPC sends the message as trailing metadata, and a client that receives more
metadata than its limit reads RESOURCE_EXHAUSTED (which routers retry) instead of the server's status, as a
duplicate request id quoted whole once did.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar, cast

import grpc

from agentloop_grpc.common.errors import (
    DuplicateRequestError,
    EngineError,
    EngineOverloadedError,
    EngineUnavailableError,
    FailedPreconditionError,
    InvalidRequestError,
    NotFoundError,
    UnsupportedError,
)

log = logging.getLogger(__name__)

#: Bytes of a status message at most (percent-encoded, still far under gRPC's default metadata limit).
MAX_DETAILS_BYTES = 1024

_CODES = (
    (InvalidRequestError, grpc.StatusCode.INVALID_ARGUMENT),
    (DuplicateRequestError, grpc.StatusCode.ALREADY_EXISTS),
    (EngineUnavailableError, grpc.StatusCode.UNAVAILABLE),
    (EngineOverloadedError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (FailedPreconditionError, grpc.StatusCode.FAILED_PRECONDITION),
    (UnsupportedError, grpc.StatusCode.UNIMPLEMENTED),
    (NotFoundError, grpc.StatusCode.NOT_FOUND),
)


def status_code_for(error: EngineError) -> grpc.StatusCode:
    for error_type, code in _CODES:
        if isinstance(error, error_type):
            return code
    return grpc.StatusCode.INTERNAL


def bounded(message: str) -> str:
    """``message`` cut to MAX_DETAILS_BYTES of UTF-8 (at a character boundary), marked when cut."""
    data = message.encode()
    if len(data) <= MAX_DETAILS_BYTES:
        return message
    return data[: MAX_DETAILS_BYTES - 3].decode(errors="ignore") + "..."


async def _abort(context: grpc.aio.ServicerContext, error: Exception, method: str) -> None:
    if isinstance(error, EngineError):
        await context.abort(status_code_for(error), bounded(str(error)))
    log.exception("%s failed with an unexpected error", method)
    message = f"{method}: internal engine error: {type(error).__name__}: {error}"
    await context.abort(grpc.StatusCode.INTERNAL, bounded(message))


Handler = TypeVar("Handler", bound=Callable[..., Any])


def map_errors(handler: Handler) -> Handler:
    """Decorate a servicer method (coroutine or async generator) so its exceptions become status codes."""
    if inspect.isasyncgenfunction(handler):

        @functools.wraps(handler)
        async def stream_handler(
            self: object, request: object, context: grpc.aio.ServicerContext
        ) -> AsyncIterator[Any]:
            try:
                async for response in handler(self, request, context):
                    yield response
            except Exception as error:  # noqa: BLE001 - mapped to a status, never swallowed
                await _abort(context, error, handler.__name__)

        return cast(Handler, stream_handler)

    @functools.wraps(handler)
    async def unary_handler(self: object, request: object, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await handler(self, request, context)
        except Exception as error:  # noqa: BLE001 - mapped to a status, never swallowed
            await _abort(context, error, handler.__name__)

    return cast(Handler, unary_handler)
