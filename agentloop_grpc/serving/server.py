"""What starts any of our servers: channel options, health and reflection, and the stop signal."""

from __future__ import annotations

import asyncio
import signal

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

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


def stop_signal() -> asyncio.Event:
    """An event set on SIGTERM or SIGINT (the servers' way to begin a graceful stop)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    return stop
