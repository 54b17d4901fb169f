"""Tool loops calling an MCP server's tool through a real ToolExecute server: killing one trajectory's MCP server
mid-call fails that trajectory alone, as an infrastructure failure whose cause says what failed, with the call on
record as the infrastructure's; the summary and the report count failures by that cause."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest

pytest.importorskip("mcp", reason="the mcp extra is not installed (make setup installs it)")

from agentloop_grpc.agent import AgentLoopWorker, Sample
from agentloop_grpc.agent.metrics import RolloutMetrics
from agentloop_grpc.rollout.report_data import error_causes
from agentloop_grpc.tools.client import GrpcToolClient
from agentloop_grpc.tools.config import ToolServerConfig
from agentloop_grpc.tools.server import create_tool_server

from .conftest import call, loop_context

pytestmark = pytest.mark.fault

SERVER = [sys.executable, str(Path(__file__).resolve().parents[1] / "tools" / "mcp_test_server.py")]
QUESTION = ({"role": "user", "content": "Wait a moment, then say done."},)


async def test_a_killed_mcp_server_fails_only_its_trajectory(codec, tmp_path) -> None:
    # unsandboxed: the server marks its calls in a host folder named by its host pid, which the test kills (a
    # sandbox writes only its own folder and has a PID namespace of its own)
    entry = {"name": "test", "command": SERVER, "env": {"MCP_TEST_MARK_DIR": str(tmp_path)}, "sandbox": False}
    config = ToolServerConfig.model_validate({"tools": [{"mcp": entry}]})
    server = await create_tool_server(config, "127.0.0.1:0")
    tools = GrpcToolClient(f"127.0.0.1:{server.port}", timeout_s=30)
    try:
        async with loop_context(codec, [call("slow", seconds=4), "done"], tools=tools) as (_, loops, _s):
            samples = [Sample(sample_id=name, messages=QUESTION) for name in ("first", "second")]
            running = asyncio.create_task(AgentLoopWorker(loops).run(samples))
            while len(in_flight := sorted(tmp_path.iterdir())) < 2:  # each trajectory's own server, its call made
                await asyncio.sleep(0.05)
            os.kill(int(in_flight[0].name), signal.SIGKILL)
            trajectories = await running
    finally:
        await tools.close()
        await server.stop(grace_s=1)
    failed = [t for t in trajectories if t.failed]
    [survivor] = [t for t in trajectories if not t.failed]
    [victim] = failed
    assert victim.infrastructure_failure and victim.infrastructure_cause == "mcp_server_crashed"
    assert "closed the connection during slow" in victim.error
    assert [(m.tool, m.error) for m in victim.tool_call_metrics] == [("slow", "infrastructure")]
    assert survivor.tool_call_metrics[0].error is None and survivor.messages[-1]["content"] == "done"
    assert RolloutMetrics.of(trajectories, 1.0).infrastructure_causes == {"mcp_server_crashed": 1}
    [cause] = error_causes(trajectories)
    assert cause["infrastructure"] and cause["what_failed"] == "mcp_server_crashed"
    assert server.instances.live_instances == 0  # both trajectories released their instances
