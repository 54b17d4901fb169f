"""The engine server: one gRPC server per engine (data-parallel group), with health, reflection and drain.

``create_server`` builds and starts a server for an adapter and returns it with its bound port (port 0 picks a
free one: tests use that). ``serve`` is the process entry point: it listens first (health says NOT_SERVING while
the model loads), starts the adapter, then runs until SIGTERM/SIGINT, when it drains: new calls are refused,
in-flight streams get ``drain_timeout_s`` to finish, whatever is left is aborted, and the process exits 0.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from agentloop_grpc.common.types import EngineState
from agentloop_grpc.serving.metrics import GaugeSample, GaugesCollector, ServerMetrics
from agentloop_grpc.serving.server import new_server, start_listening, stop_signal
from agentloop_grpc.serving.server_security import ServerSecurity, bind
from agentloop_grpc.serving.supervise import supervise
from agentloop_grpc.v1 import engine_pb2_grpc, generation_pb2_grpc

from .lifecycle import EngineLifecycle
from .protocol import EngineAdapter
from .servicer import SERVICE_NAMES, EngineServicer

log = logging.getLogger(__name__)

#: What a caller of an engine server can do (said when it listens beyond loopback without a token).
ENGINE_EXPOSES = ("generate, pause or abort everyone's generations (Pause, Abort all), replace the policy "
                  "(UpdateWeights, LoadWeights: a file the server reads, JoinWeightGroup + ReceiveWeights: bytes "
                  "from an address the caller names), and Sleep, WakeUp or FlushCache the engine")


# After aborting at the drain deadline, how long the aborted streams get to deliver their final message.
_ABORT_FLUSH_S = 2.0


@dataclass(slots=True)
class EngineServer:
    """A started engine server."""

    server: grpc.aio.Server
    port: int
    servicer: EngineServicer
    lifecycle: EngineLifecycle

    async def stop(self, grace_s: float = 30.0) -> None:
        """Drain: refuse new Generate calls, give in-flight ones ``grace_s`` to finish, abort the rest (their
        streams end with FINISH_REASON_ABORT, so clients keep their tokens), then stop and release the engine."""
        await self.servicer.begin_drain()
        if not await self.lifecycle.wait_idle(grace_s):
            aborted = await self.lifecycle.abort(None)
            log.warning("drain timeout: aborted %d in-flight requests", len(aborted))
            await self.lifecycle.wait_idle(_ABORT_FLUSH_S)
        await self.server.stop(_ABORT_FLUSH_S)
        await self.lifecycle.shutdown()


def engine_gauges(lifecycle: EngineLifecycle) -> GaugesCollector:
    """What the engine reports of itself (GetLoad and GetServerInfo figures), read when scraped."""

    def read() -> list[GaugeSample]:
        now = lifecycle.state
        gauges: list[GaugeSample] = [("agentloop_engine_weight_version", "Weight version loaded", {},
                                      lifecycle.weight_version)]
        gauges += [("agentloop_engine_state", "1 for the engine's current state", {"state": state.value},
                    1.0 if state is now else 0.0) for state in EngineState]
        try:
            load = lifecycle.load()
        except Exception:  # noqa: BLE001 (an engine that is loading or asleep may have no load to report)
            return gauges
        return gauges + [
            ("agentloop_engine_running_requests", "Requests being decoded", {}, load.running_requests),
            ("agentloop_engine_waiting_requests", "Requests queued", {}, load.waiting_requests),
            ("agentloop_engine_max_running_requests", "Batch capacity", {}, load.max_running_requests),
            ("agentloop_engine_kv_cache_usage", "Fraction of the KV cache in use", {}, load.kv_cache_usage),
            ("agentloop_engine_prefix_cache_hit_rate", "Prompt tokens served from the prefix cache, as a fraction",
             {}, load.prefix_cache_hit_rate),
            ("agentloop_engine_preemptions", "Requests preempted since start (0 where the engine cannot tell)", {},
             load.preemptions),
        ]

    return GaugesCollector(read)


async def create_server(
    adapter: EngineAdapter,
    address: str = "127.0.0.1:0",
    security: ServerSecurity | None = None,
    metrics: ServerMetrics | None = None,
) -> EngineServer:
    """Serve ``adapter`` on ``address`` (with ``security``'s TLS and tokens, counting into ``metrics``); the
    adapter is not started here (see ``start_adapter``)."""
    lifecycle = EngineLifecycle(adapter)
    if metrics is not None:
        metrics.registry.register(engine_gauges(lifecycle))
    server, health_servicer = new_server(SERVICE_NAMES, security, metrics)
    servicer = EngineServicer(lifecycle, health_servicer)
    generation_pb2_grpc.add_TokenGenerateServicer_to_server(servicer, server)
    engine_pb2_grpc.add_EngineControlServicer_to_server(servicer, server)
    port = bind(server, address, security, ENGINE_EXPOSES)
    await servicer.sync_health()
    await server.start()
    return EngineServer(server=server, port=port, servicer=servicer, lifecycle=lifecycle)


async def start_adapter(engine_server: EngineServer) -> None:
    """Load the engine, then report SERVING."""
    await engine_server.lifecycle.start()
    await engine_server.servicer.sync_health()


async def serve(
    adapter: EngineAdapter,
    address: str,
    drain_timeout_s: float = 30.0,
    on_listening: Callable[[int], None] | None = None,
    security: ServerSecurity | None = None,
    metrics_port: int | None = None,
    on_metrics: Callable[[int], None] | None = None,
) -> None:
    """Run an engine server until SIGTERM or SIGINT, then drain and return. With ``metrics_port``, Prometheus
    metrics are served on the same host at that port (0: a free one, told to ``on_metrics``). A signal while the
    model loads cancels the load (the adapter reaps what it began) and releases the engine; a load that fails
    releases it too, then raises (``serving.supervise``)."""
    stop = stop_signal()  # before anyone can learn the port: a SIGTERM from then on drains, never kills
    engine_server = await start_listening(lambda metrics: create_server(adapter, address, security, metrics),
                                          address, metrics_port, on_listening, on_metrics)

    async def drain() -> None:
        log.info("shutting down: draining in-flight requests for up to %.0f s", drain_timeout_s)
        await engine_server.stop(drain_timeout_s)

    await supervise(lambda: start_adapter(engine_server), drain, stop)
    log.info("engine server stopped")
