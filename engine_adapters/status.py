"""One place that turns adapter exceptions into gRPC status codes, for unary, client- and server-streaming handlers.

Handlers raise; this decorator aborts the call with the mapped code and the exception's message. An exception
that is not an EngineError is an engine bug: it is logged with its traceback and reported as INTERNAL, and the
server stays up.
"""

from __future__ import annotations

import functools
import inspect
import logging

import grpc

from .errors import (
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


async def _abort(context: grpc.aio.ServicerContext, error: Exception, method: str) -> None:
    if isinstance(error, EngineError):
        await context.abort(status_code_for(error), str(error))
    log.exception("%s failed with an unexpected error", method)
    await context.abort(grpc.StatusCode.INTERNAL, f"{method}: internal engine error: {type(error).__name__}: {error}")


def map_errors(handler):
    """Decorate a servicer method (coroutine or async generator) so its exceptions become status codes."""
    if inspect.isasyncgenfunction(handler):

        @functools.wraps(handler)
        async def stream_handler(self, request, context):
            try:
                async for response in handler(self, request, context):
                    yield response
            except Exception as error:  # noqa: BLE001 - mapped to a status, never swallowed
                await _abort(context, error, handler.__name__)

        return stream_handler

    @functools.wraps(handler)
    async def unary_handler(self, request, context):
        try:
            return await handler(self, request, context)
        except Exception as error:  # noqa: BLE001 - mapped to a status, never swallowed
            await _abort(context, error, handler.__name__)

    return unary_handler
