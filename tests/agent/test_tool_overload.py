"""Agent loops against a real tool server under a burst: no trajectory is lost to a full server, and one refused
until its deadline is an infrastructure failure whose cause says overload."""

from __future__ import annotations

import pytest

from agentloop_grpc.agent import AgentLoopWorker, Sample
from agentloop_grpc.rollout.report_data import error_causes

from ..tools.conftest import gated_server, slots_held, tool_server
from .conftest import call, loop_context

pytestmark = pytest.mark.fault

QUESTION = ({"role": "user", "content": "What is 6 * 7?"},)
REPLIES = [call("calculator", expression="6*7"), "42"]


async def test_a_batch_whose_tool_calls_come_together_loses_no_trajectory(codec) -> None:
    """With no fault injected, 25 of 100 trajectories were lost: their tool calls, past the server's 64 running,
    were refused and dropped as infrastructure failures."""
    async with tool_server() as (_, tools), loop_context(codec, REPLIES, tools=tools) as (_, loops, _s):
        samples = [Sample(sample_id=f"s{i}", messages=QUESTION) for i in range(100)]
        trajectories = await AgentLoopWorker(loops, max_concurrency=256).run(samples)
    assert [t.error for t in trajectories if t.failed] == []
    assert all(t.tool_calls == 1 for t in trajectories)


async def test_a_tool_server_full_until_the_deadline_is_reported_as_overload(codec) -> None:
    async with gated_server("loop", running=1, queued=0, timeout_s=1.0) as (server, tools, _):
        async with slots_held(server, "loop"), loop_context(codec, REPLIES, tools=tools) as (_, loops, _s):
            [trajectory] = await AgentLoopWorker(loops).run([Sample(sample_id="s", messages=QUESTION)])
    assert trajectory.failed and trajectory.infrastructure_failure
    assert error_causes([trajectory]) == [{
        "cause": "tool server overloaded: Execute refused as full until its deadline", "infrastructure": True,
        "what_failed": "tool_server_overloaded", "count": 1, "samples": ["s"]}]
