"""The interceptor chain of a server: metrics, then the token check."""

from __future__ import annotations

import grpc

from .metrics import MetricsInterceptor, ServerMetrics
from .server_security import ServerSecurity


def server_interceptors(
    security: ServerSecurity | None, metrics: ServerMetrics | None = None
) -> list[grpc.aio.ServerInterceptor]:
    """What to pass to ``grpc.aio.server``: metrics first, so they count the calls the token check refuses too."""
    chain: list[grpc.aio.ServerInterceptor] = [MetricsInterceptor(metrics)] if metrics is not None else []
    on_refusal = (lambda code: metrics.auth_failures.labels(code).inc()) if metrics is not None else None
    interceptor = security.interceptor(on_refusal) if security is not None else None
    return chain + ([interceptor] if interceptor is not None else [])
