"""Router errors, split the way a rollout needs them: the caller's fault vs the infrastructure's.

A RequestError (bad input, refused by every engine the same way) must not be retried and is the caller's bug.
An InfrastructureError (no healthy server, retries exhausted) says nothing about the model: trajectories that hit
it are marked as infrastructure failures and never trained on.
"""

from __future__ import annotations

import grpc


class RouterError(Exception):
    """Base of the Router's errors."""


class RequestError(RouterError):
    """The engine refused the request itself (INVALID_ARGUMENT, ALREADY_EXISTS, UNIMPLEMENTED, ...)."""

    def __init__(self, code: grpc.StatusCode, details: str, server: str) -> None:
        super().__init__(f"{code.name} from {server}: {details}")
        self.code = code
        self.details = details
        self.server = server


class InfrastructureError(RouterError):
    """No server could serve: all down, retries exhausted, or the deadline passed while failing over. ``cause``
    names it for counting (``engine``, ``no_healthy_engine``)."""

    def __init__(self, message: str, cause: str = "engine") -> None:
        super().__init__(message)
        self.cause = cause


class NoHealthyServerError(InfrastructureError):
    """No healthy server within the wait bound."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "no_healthy_engine")
