"""Endpoint: the Fleet's view of one engine server.

One HTTP/2 channel per server, reused by every call. Two background tasks keep the view fresh: a
``grpc.health.v1`` Watch stream (the server pushes SERVING / NOT_SERVING as it loads, sleeps or drains; a broken
stream means the server is gone, and the watch is retried) and a periodic GetLoad that refines the locally
counted in-flight requests with what the server itself reports (other clients' load included). Every completed
generation carries the same report (``GenerateComplete.load``), so a server that finished one of our requests
within ``load_poll_interval_s`` is not polled, and one carrying none of our requests is polled every
``idle_load_poll_interval_s`` only: W Routers over S servers would otherwise each send S polls every interval
however many calls they make (figures in NOTES.md).

A hung server is found two ways. The channel pings the server when nothing arrives for a while, and closes the
connection when a ping goes unanswered (a stopped process, a partition: the peer's kernel may still acknowledge
TCP, but nothing answers HTTP/2): every call on it fails UNAVAILABLE and fails over, and the watch sees the server
gone. A server whose connection answers pings but whose handlers do not run (a wedged event loop) answers no
GetLoad: when polls have gone unanswered for ``RouterConfig.liveness_timeout_s``, the server is taken out and the
Router's generate calls on it are cancelled, to fail over as from a dead server.

A completion proves the server's handlers run as well as a poll answer does, so either one resets the liveness
clock. GetServerInfo is fetched each time the server becomes SERVING (it may have restarted with other weights)
and at every poll while it is held out for an old weight version (see versions.py): such a server is polled
whatever it reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentloop_grpc.channels import open_channel
from agentloop_grpc.v1 import engine_pb2, engine_pb2_grpc, generation_pb2, generation_pb2_grpc

from .config import RouterConfig
from .lowest_load import LowestLoad
from .metrics import RouterMetrics
from .replies import ServerInfo, server_info
from .versions import WeightVersions

log = logging.getLogger(__name__)

_CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
)
_SERVING = health_pb2.HealthCheckResponse.SERVING


class Endpoint:
    """One engine server: channel, stubs, health, load and server info."""

    def __init__(
        self, address: str, config: RouterConfig, metrics: RouterMetrics, versions: WeightVersions,
        lowest: LowestLoad,
    ) -> None:
        self.address = address
        self._config = config
        self._metrics = metrics
        self._versions = versions
        self._lowest = lowest  # the Fleet's lowest load over healthy servers: told each change of this one's
        self.channel = open_channel(address, config.security, _CHANNEL_OPTIONS)
        self.generate = generation_pb2_grpc.TokenGenerateStub(self.channel)
        self.control = engine_pb2_grpc.EngineControlStub(self.channel)
        self._health = health_pb2_grpc.HealthStub(self.channel)
        self.healthy = False
        # gRPC C-core cancels streams when one channel carries too many at once (figures in NOTES.md); callers
        # beyond the bound wait for a slot instead
        self.stream_slots = asyncio.Semaphore(config.max_streams_per_server)
        self.in_flight = 0
        self.reported_load = 0
        #: In-flight requests as best known: our own count, or the server's report if it saw more. Kept as either
        #: changes (``_set_load``), not computed when read: every generate reads it (figures in NOTES.md).
        self.load = 0
        #: The last report found the KV cache nearly full, or preemptions rose within the last poll interval: no
        #: new sessions here (cache_aware).
        self.pressured = False
        self._preemptions: int | None = None  # the count at the last report (None: no report yet)
        self._preempted_at = -float("inf")
        self._reported_at = 0.0  # when the last load report (poll answer or completion) arrived
        self.info: ServerInfo | None = None
        self._watch_task: asyncio.Task | None = None
        self._poll_task: asyncio.Task | None = None
        # the Router's generate calls here, and those it cancelled because the server stopped answering
        self._calls: set[grpc.aio.Call] = set()
        self._abandoned: set[grpc.aio.Call] = set()
        self._lost = False  # taken out for answering nothing, until it says SERVING again
        self._answered_at = 0.0
        # the gauges read the counts when scraped: setting them on every begin, end and completion cost each
        # generate three lock round trips for values read once per scrape at most
        metrics.in_flight.labels(address).set_function(lambda: self.in_flight)
        metrics.server_load.labels(address).set_function(lambda: self.reported_load)

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
        # the gauges keep their last readings, not a reference to this closed endpoint (and its channel)
        in_flight, reported = self.in_flight, self.reported_load
        self._metrics.in_flight.labels(self.address).set_function(lambda: in_flight)
        self._metrics.server_load.labels(self.address).set_function(lambda: reported)

    async def take_slot(self, deadline: float) -> bool:
        """Take one of the call slots, waiting until ``deadline`` (``time.monotonic``) at most; whether one was
        taken. The caller gives it back with ``stream_slots.release()``."""
        if not self.stream_slots.locked():  # a free slot is taken at once: no timer for the common case
            await self.stream_slots.acquire()
            return True
        try:
            async with asyncio.timeout(deadline - time.monotonic()):
                await self.stream_slots.acquire()
        except TimeoutError:  # the deadline passed with every slot still taken: no slot is held
            return False
        return True

    def begin_request(self, call: grpc.aio.Call) -> None:
        """A generate call started here (one started after the server was lost is cancelled at once)."""
        self.in_flight += 1
        self._set_load(max(self.in_flight, self.reported_load))
        self._calls.add(call)
        if self._lost:
            self._abandon(call)

    def end_request(self, call: grpc.aio.Call) -> None:
        self.in_flight -= 1
        self._set_load(max(self.in_flight, self.reported_load))
        self._calls.discard(call)
        if self._abandoned:
            self._abandoned.discard(call)

    def _set_load(self, load: int) -> None:
        if load != self.load:
            if self.healthy:
                self._lowest.move(self.load, load)
            self.load = load

    def report_load(self, load: generation_pb2.GetLoadResponse) -> None:
        """The server's load as it reported it (a GetLoad answer, or the one a completion carries): it answers."""
        now = time.monotonic()
        self._answered_at = self._reported_at = now
        self.reported_load = load.running_requests + load.waiting_requests
        self._set_load(max(self.in_flight, self.reported_load))
        # preemptions count since the server started: any rise means the engine evicts running work to fit (the
        # first report's count may be old); a rise keeps new sessions away for one poll interval, as long as when
        # only polls reported it
        if self._preemptions is not None and load.preemptions > self._preemptions:
            self._preempted_at = now
        self._preemptions = load.preemptions
        full = load.kv_cache_usage >= self._config.kv_pressure_usage
        self.pressured = full or now - self._preempted_at < self._config.load_poll_interval_s

    def abandoned(self, call: grpc.aio.Call) -> bool:
        """Whether ``call`` was cancelled because the server stopped answering, not by its caller's cancellation."""
        task = asyncio.current_task()
        return call in self._abandoned and not (task is not None and task.cancelling())

    def hung_error(self) -> grpc.aio.AioRpcError:
        """What an abandoned call failed with: UNAVAILABLE, as from a dead server."""
        details = f"{self.address} answered no GetLoad for {self._config.liveness_timeout_s} s"
        return grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), details)

    def mark_unavailable(self) -> None:
        """A call failed with UNAVAILABLE: stop routing here until the server says SERVING again."""
        if self._watch_task is not None and not self._watch_task.done():
            self._watch_task.cancel()
        self._set_healthy(False)
        self._watch_task = asyncio.create_task(
            self._watch_health(delay_s=self._config.health_retry_interval_s), name=f"health-{self.address}"
        )

    def _lose(self) -> None:
        """Take out a server that answers nothing, and cancel its generate calls so that they fail over."""
        log.warning(
            "server %s answered no GetLoad for %.1f s: taken out of routing; %d generate calls fail over",
            self.address, self._config.liveness_timeout_s, len(self._calls),
        )
        self._metrics.servers_lost.labels(self.address).inc()
        self._lost = True
        for call in list(self._calls):
            self._abandon(call)
        self.mark_unavailable()

    def _abandon(self, call: grpc.aio.Call) -> None:
        self._abandoned.add(call)
        call.cancel()

    def _set_healthy(self, healthy: bool) -> None:
        if healthy != self.healthy:
            log.info("server %s is %s", self.address, "serving" if healthy else "not serving")
            if healthy:
                self._lost = False
                self._answered_at = time.monotonic()  # the time it was out does not count against it
                self._lowest.add(self.load)
            else:
                self._lowest.remove(self.load)
        self.healthy = healthy
        self._metrics.server_healthy.labels(self.address).set(1 if healthy else 0)

    async def _watch_health(self, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        while True:
            try:
                # typeshed's HealthStub declares no methods
                async for response in self._health.Watch(  # type: ignore[attr-defined]
                    health_pb2.HealthCheckRequest(service="")
                ):
                    serving = response.status == _SERVING
                    if serving and not self.healthy:  # (re)connected or woken: a restart brings other weights
                        await self._refresh_info(self._config.control_timeout_s)
                    self._set_healthy(serving)
            except grpc.aio.AioRpcError as error:
                log.debug("health watch of %s ended: %s", self.address, error.code().name)
            self._set_healthy(False)
            await asyncio.sleep(self._config.health_retry_interval_s)

    async def _refresh_info(self, timeout_s: float) -> None:
        self.info = server_info(await self.control.GetServerInfo(engine_pb2.GetServerInfoRequest(), timeout=timeout_s))
        self._versions.report(self.address, self.info.weight_version)

    async def _poll_load(self) -> None:
        config = self._config
        interval_s, liveness_s = config.load_poll_interval_s, config.liveness_timeout_s
        idle_s = max(interval_s, config.idle_load_poll_interval_s)
        due = time.monotonic() + interval_s
        while True:
            # awake every interval at least: a server that takes one of our requests meanwhile is due sooner
            await asyncio.sleep(min(interval_s, max(0.0, due - time.monotonic())))
            behind = self.address in self._versions.behind
            # due one interval after the last report (a poll's or a completion's); one idle interval for a server
            # carrying none of our requests, where only its liveness and other clients' load are at stake
            due = self._reported_at + (interval_s if self.in_flight or behind else idle_s)
            if due > time.monotonic() and not behind:
                continue
            due = time.monotonic() + interval_s
            if not self.healthy:
                continue
            # a poll waits for what is left of the bound (1 s at least): a hung server's poll times out at the bound,
            # while a slow link's answer (a round trip of more than a second) still counts as one
            timeout_s = max(1.0, liveness_s - (time.monotonic() - self._answered_at))
            try:
                if behind:  # held out: updated since by someone?
                    await self._refresh_info(timeout_s)
                load = await self.generate.GetLoad(generation_pb2.GetLoadRequest(), timeout=timeout_s)
            except grpc.aio.AioRpcError as error:
                # polls unanswered for the whole bound: hung; any other failure is the health watch's to judge
                hung = error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                if hung and self.healthy and time.monotonic() - self._answered_at >= liveness_s:
                    self._lose()
                continue
            self.report_load(load)
