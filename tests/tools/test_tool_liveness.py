"""A tool server that stops answering (SIGSTOP: the kernel still accepts its TCP, nothing answers HTTP/2) fails
the tool client's calls within seconds through keepalive, not at the tool deadline; SIGCONT brings it back."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from agentloop_grpc.tools.client import GrpcToolClient, ToolInfrastructureError

pytestmark = pytest.mark.fault

AGENTLOOP = [sys.executable, "-m", "agentloop_grpc.cli"]


@pytest.mark.slow
async def test_a_stopped_tool_server_fails_calls_in_seconds_not_at_the_deadline() -> None:
    server = subprocess.Popen([*AGENTLOOP, "tools", "serve", "--config", "agentloop_grpc/tools/builtin.yaml", "--port", "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
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
