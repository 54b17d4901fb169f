"""Endpoint: the Router's view of one engine server.

One HTTP/2 channel per server, reused by every call. Two background tasks keep the view fresh: a
``grpc.health.v1`` Watch stream (the server pushes SERVING / NOT_SERVING as it loads, sleeps or drains; a broken
stream means the server is gone, and the watch is retried) and a periodic GetLoad that refines the locally
counted in-flight requests with what the server itself reports (other clients' load included).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentloop_grpc.security import open_channel
from agentloop_grpc.v1 import engine_pb2, engine_pb2_grpc, generation_pb2, generation_pb2_grpc

from .config import RouterConfig
from .metrics import RouterMetrics

log = logging.getLogger(__name__)

_CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
)
_SERVING = health_pb2.HealthCheckResponse.SERVING


class Endpoint:
    """One engine server: channel, stubs, health, load and server info."""

    def __init__(self, address: str, config: RouterConfig, metrics: RouterMetrics) -> None:
        self.address = address
        self._config = config
        self._metrics = metrics
        self.channel = open_channel(address, config.security, _CHANNEL_OPTIONS)
        self.generate = generation_pb2_grpc.TokenGenerateStub(self.channel)
        self.control = engine_pb2_grpc.EngineControlStub(self.channel)
        self._health = health_pb2_grpc.HealthStub(self.channel)
        self.healthy = False
        # gRPC C-core cancels streams beyond ~1,000 concurrent ones on one channel (measured: 3,000 concurrent
        # generates on one channel lost ~1,800 with CANCELLED); callers beyond the bound wait for a slot instead
        self.stream_slots = asyncio.Semaphore(config.max_streams_per_server)
        self.in_flight = 0
        self.reported_load = 0
        self.info: engine_pb2.GetServerInfoResponse | None = None
        self._watch_task: asyncio.Task | None = None
        self._poll_task: asyncio.Task | None = None
        # the gauge reads the count when scraped: setting it on every begin and end cost each generate two lock
        # round trips (~10 k instructions, callgrind) for a value read once per scrape at most
        metrics.in_flight.labels(address).set_function(lambda: self.in_flight)

    @property
    def load(self) -> int:
        """In-flight requests as best known: our own count, or the server's report if it saw more."""
        return max(self.in_flight, self.reported_load)

    def start(self) -> None:
        self._watch_task = asyncio.create_task(self._watch_health(delay_s=0.0), name=f"health-{self.address}")
        self._poll_task = asyncio.create_task(self._poll_load(), name=f"load-{self.address}")

    async def close(self) -> None:
        for task in (self._watch_task, self._poll_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._set_healthy(False)
        await self.channel.close()
        # the gauge keeps its last reading, not a reference to this closed endpoint (and its channel)
        last = self.in_flight
        self._metrics.in_flight.labels(self.address).set_function(lambda: last)

    def begin_request(self) -> None:
        self.in_flight += 1

    def end_request(self) -> None:
        self.in_flight -= 1

    def mark_unavailable(self) -> None:
        """A call failed with UNAVAILABLE: stop routing here until the server says SERVING again."""
        if self._watch_task is not None and not self._watch_task.done():
            self._watch_task.cancel()
        self._set_healthy(False)
        self._watch_task = asyncio.create_task(
            self._watch_health(delay_s=self._config.health_retry_interval_s), name=f"health-{self.address}"
        )

    def _set_healthy(self, healthy: bool) -> None:
        if healthy != self.healthy:
            log.info("server %s is %s", self.address, "serving" if healthy else "not serving")
        self.healthy = healthy
        self._metrics.server_healthy.labels(self.address).set(1 if healthy else 0)

    async def _watch_health(self, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        while True:
            try:
                async for response in self._health.Watch(health_pb2.HealthCheckRequest(service="")):
                    serving = response.status == _SERVING
                    if serving and self.info is None:
                        self.info = await self.control.GetServerInfo(
                            engine_pb2.GetServerInfoRequest(), timeout=self._config.control_timeout_s
                        )
                    self._set_healthy(serving)
            except grpc.aio.AioRpcError as error:
                log.debug("health watch of %s ended: %s", self.address, error.code().name)
            self._set_healthy(False)
            await asyncio.sleep(self._config.health_retry_interval_s)

    async def _poll_load(self) -> None:
        while True:
            await asyncio.sleep(self._config.load_poll_interval_s)
            if not self.healthy:
                continue
            try:
                load = await self.generate.GetLoad(
                    generation_pb2.GetLoadRequest(), timeout=max(1.0, self._config.load_poll_interval_s)
                )
            except grpc.aio.AioRpcError:
                continue  # the health watch decides about the server's health
            self.reported_load = load.running_requests + load.waiting_requests
            self._metrics.server_load.labels(self.address).set(self.reported_load)
