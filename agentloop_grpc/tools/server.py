"""The ToolExecute server: tools from a config, health, reflection, graceful stop (same shape as engine servers)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2

from agentloop_grpc.serving.metrics import GaugeSample, GaugesCollector, ServerMetrics
from agentloop_grpc.serving.server import new_server, start_listening, stop_signal
from agentloop_grpc.serving.server_security import ServerSecurity, bind
from agentloop_grpc.v1 import tool_pb2_grpc

from .config import ToolServerConfig, open_tools
from .instances import InstanceManager
from .servicer import SERVICE_NAME, ToolExecuteServicer

log = logging.getLogger(__name__)


@dataclass(slots=True)
class ToolServer:
    server: grpc.aio.Server
    port: int
    instances: InstanceManager

    async def stop(self, grace_s: float = 10.0) -> None:
        await self.server.stop(grace_s)
        await self.instances.close()


def tool_gauges(instances: InstanceManager) -> GaugesCollector:
    """The server's load, read when scraped: what a burst looks like (running, queued) against the limits."""

    def read() -> list[GaugeSample]:
        limits = instances.limits
        return [
            ("agentloop_tool_running_executions", "Execute calls running", {}, instances.running_executions),
            ("agentloop_tool_queued_executions", "Execute calls waiting for a running slot or their instance", {},
             instances.queued_executions),
            ("agentloop_tool_max_running_executions", "Execute calls that may run at once", {},
             limits.max_concurrent_executions),
            ("agentloop_tool_max_queued_executions", "Execute calls that may wait before RESOURCE_EXHAUSTED", {},
             limits.max_queued_executions),
            ("agentloop_tool_live_instances", "Tool instances alive", {}, instances.live_instances),
            ("agentloop_tool_max_instances", "Tool instances that may live at once", {}, limits.max_instances),
        ]

    return GaugesCollector(read)


#: What a caller of a tool server can do (said when it listens beyond loopback without a token).
TOOLS_EXPOSE = "run code in the python sandbox and call every tool this server serves"


async def create_tool_server(
    config: ToolServerConfig,
    address: str = "127.0.0.1:0",
    security: ServerSecurity | None = None,
    metrics: ServerMetrics | None = None,
) -> ToolServer:
    instances = InstanceManager(await open_tools(config), config.limits)
    if metrics is not None:
        metrics.registry.register(tool_gauges(instances))
    server, health = new_server((SERVICE_NAME,), security, metrics)
    tool_pb2_grpc.add_ToolExecuteServicer_to_server(ToolExecuteServicer(instances), server)
    port = bind(server, address, security, TOOLS_EXPOSE)
    await server.start()
    instances.start()
    for name in ("", SERVICE_NAME):
        await health.set(name, health_pb2.HealthCheckResponse.SERVING)
    return ToolServer(server, port, instances)


async def serve_tools(
    config: ToolServerConfig,
    address: str,
    on_listening: Callable[[int], None] | None = None,
    security: ServerSecurity | None = None,
    metrics_port: int | None = None,
    on_metrics: Callable[[int], None] | None = None,
) -> None:
    """Run until SIGTERM or SIGINT, then stop (in-flight calls get a grace period) and release every instance.
    With ``metrics_port``, Prometheus metrics are served on the same host at that port (0: a free one)."""
    stop = stop_signal()  # before anyone can learn the port: a SIGTERM from then on is a clean stop
    tool_server = await start_listening(lambda metrics: create_tool_server(config, address, security, metrics),
                                        address, metrics_port, on_listening, on_metrics)
    await stop.wait()
    await tool_server.stop()
