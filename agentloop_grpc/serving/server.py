"""What starts any of our servers: channel options, interceptors, health and reflection, the stop signal, and
the order in which a server tells its port and serves its metrics."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from .interceptors import server_interceptors
from .metrics import ServerMetrics, expose
from .server_security import ServerSecurity

# UpdateWeights messages carry tensor slices; clients should keep them under this size.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
SERVER_OPTIONS = (
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),  # a port in use is an error, not a shared listener
    # clients ping to find a hung server (see RouterConfig); a server that refused their pings as too frequent
    # would close the connection (GOAWAY too_many_pings) and fail healthy calls
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 1000),
    ("grpc.http2.max_ping_strikes", 0),
    # and the server pings its clients, so the streams of a vanished client are cancelled (and their requests
    # aborted in the engine) instead of decoding for nobody
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    # grpcio waits this long for a keepalive ping's answer, whatever keepalive_timeout_ms says
    ("grpc.http2.ping_timeout_ms", 10_000),
)


def add_health_and_reflection(server: grpc.aio.Server, service_names: tuple[str, ...]) -> health.aio.HealthServicer:
    """Standard grpc.health.v1 and server reflection for ``service_names`` (every server of ours has both)."""
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (*service_names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME), server
    )
    return health_servicer


def new_server(service_names: tuple[str, ...], security: ServerSecurity | None,
               metrics: ServerMetrics | None) -> tuple[grpc.aio.Server, health.aio.HealthServicer]:
    """A server with our options and interceptors (tokens, metrics), and health and reflection for
    ``service_names``; the caller adds its servicers, binds and starts it."""
    server = grpc.aio.server(options=SERVER_OPTIONS, interceptors=server_interceptors(security, metrics))
    return server, add_health_and_reflection(server, service_names)


class _Listening(Protocol):
    port: int


Started = TypeVar("Started", bound=_Listening)


async def start_listening(
    create: Callable[[ServerMetrics | None], Awaitable[Started]],
    address: str,
    metrics_port: int | None,
    on_listening: Callable[[int], None] | None,
    on_metrics: Callable[[int], None] | None,
) -> Started:
    """``create(metrics)`` a started server, tell its port, then serve its Prometheus metrics on the same host at
    ``metrics_port`` (0: a free one, told to ``on_metrics``; None: no metrics): whoever waits for the port learns
    it before anything else can fail."""
    metrics = ServerMetrics() if metrics_port is not None else None
    started = await create(metrics)
    if on_listening is not None:
        on_listening(started.port)
    if metrics is not None and metrics_port is not None:
        expose(metrics, address, metrics_port, on_metrics)
    return started


def stop_signal() -> asyncio.Event:
    """An event set on SIGTERM or SIGINT (the servers' way to begin a graceful stop)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    return stop
