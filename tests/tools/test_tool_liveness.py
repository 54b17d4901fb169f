"""A tool server that stops answering (SIGSTOP: the kernel still accepts its TCP, nothing answers HTTP/2) fails
the tool client's calls within seconds through keepalive, not at the tool deadline; SIGCONT brings it back."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import grpc
import pytest

from agentloop_grpc.tools.client import GrpcToolClient, ToolInfrastructureError
from agentloop_grpc.v1 import tool_pb2, tool_pb2_grpc

pytestmark = pytest.mark.fault

AGENTLOOP = [sys.executable, "-m", "agentloop_grpc.cli"]


@pytest.mark.slow
async def test_a_stopped_tool_server_fails_calls_in_seconds_not_at_the_deadline() -> None:
    server = subprocess.Popen(
        [*AGENTLOOP, "tools", "serve", "--config", "agentloop_grpc/tools/builtin.yaml", "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    client = None
    try:
        address = server.stdout.readline().split("listening on ", 1)[1].split()[0]
        client = GrpcToolClient(address, timeout_s=120)
        instance = await client.create_instance("calculator", "t")
        server.send_signal(signal.SIGSTOP)
        started = time.monotonic()
        with pytest.raises(ToolInfrastructureError, match="UNAVAILABLE"):
            await client.execute(instance, '{"expression": "1 + 1"}')
        assert time.monotonic() - started < 40  # keepalive: a ping after 5 s, its answer due 5 s later
        server.send_signal(signal.SIGCONT)
        again = await client.create_instance("calculator", "t2")
        assert "2" in (await client.execute(again, '{"expression": "1 + 1"}')).content
    finally:
        server.send_signal(signal.SIGCONT)
        if client is not None:
            await client.close()
        server.send_signal(signal.SIGTERM)
        server.communicate(timeout=60)


class _DropsTheFirstCall(tool_pb2_grpc.ToolExecuteServicer):
    """A server whose first call of each kind fails UNAVAILABLE, as a connection lost before its answer does."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def _first_fails(self, name: str, context) -> None:
        self.calls.append(name)
        if self.calls.count(name) == 1:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "Stream removed (ping timeout)")

    async def CreateInstance(self, request, context):
        await self._first_fails("CreateInstance", context)
        return tool_pb2.CreateInstanceResponse(instance_id="i1")

    async def Execute(self, request, context):
        await self._first_fails("Execute", context)
        return tool_pb2.ExecuteResponse(content="2")


async def test_a_call_safe_to_repeat_is_sent_again_after_unavailable_and_execute_is_not() -> None:
    # the transient of a server that resumes (the first call after SIGCONT may land on a transport whose keepalive
    # gives up while the server catches up, as the test above saw under load): an instance is still made, while an
    # Execute that may have run is never repeated
    servicer = _DropsTheFirstCall()  # type: ignore[abstract]  # the client under test calls only the two it defines
    server = grpc.aio.server()
    tool_pb2_grpc.add_ToolExecuteServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    client = GrpcToolClient(f"127.0.0.1:{port}", timeout_s=30)
    try:
        assert await client.create_instance("calculator", "t") == "i1"
        with pytest.raises(ToolInfrastructureError, match="UNAVAILABLE"):
            await client.execute("i1", '{"expression": "1 + 1"}')
        assert servicer.calls == ["CreateInstance", "CreateInstance", "Execute"]
    finally:
        await client.close()
        await server.stop(0)
