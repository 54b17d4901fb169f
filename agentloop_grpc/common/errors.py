"""Exceptions adapters and servers raise; ``status.py`` maps each to one gRPC status code (engine and tool
servers alike).

The split follows what a caller should do next: fix the request (invalid, duplicate, unsupported), try another
server (unavailable, overloaded) or change the engine's state first (failed precondition). Anything else that
escapes an adapter is an engine bug and becomes INTERNAL.
"""


class EngineError(Exception):
    """Base of every error an adapter raises on purpose."""


class InvalidRequestError(EngineError):
    """The request is malformed (INVALID_ARGUMENT); the message names the field and the bound."""


class DuplicateRequestError(EngineError):
    """A request with the same id is in flight (ALREADY_EXISTS)."""


class EngineUnavailableError(EngineError):
    """The engine cannot serve now: loading, asleep, draining or dead (UNAVAILABLE); retry elsewhere."""


class EngineOverloadedError(EngineError):
    """The waiting queue is full (RESOURCE_EXHAUSTED)."""


class FailedPreconditionError(EngineError):
    """The engine's state forbids the call (FAILED_PRECONDITION), e.g. Sleep with requests in flight."""


class UnsupportedError(EngineError):
    """The engine cannot honour a requested feature (UNIMPLEMENTED)."""


class NotFoundError(EngineError):
    """The named thing does not exist (NOT_FOUND), e.g. an unknown tool or a released tool instance."""
