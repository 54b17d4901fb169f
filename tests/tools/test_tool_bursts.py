"""A burst of tool calls waits instead of losing trajectories: the server queues past its running limit, the
client retries a full server within the call's deadline, and a refusal that lasts to the deadline says overload."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest

from agentloop_grpc.tools.client import (
    GrpcToolClient,
    InProcessToolClient,
    ToolInfrastructureError,
    ToolServerOverloadedError,
)
from agentloop_grpc.tools.config import ToolLimits, build_tools, load_config
from agentloop_grpc.tools.errors import FULL_METADATA
from agentloop_grpc.tools.instances import InstanceManager
from agentloop_grpc.v1 import tool_pb2, tool_pb2_grpc

from .conftest import BUILTIN, gated_server, slots_held, tool_server, until
from .gate_tool import gate

pytestmark = pytest.mark.fault


async def test_a_burst_of_100_calls_on_100_instances_is_answered_in_full() -> None:
    """At the default limits (64 running) 100 calls ending together gave 64 answers and 36 RESOURCE_EXHAUSTED,
    each a trajectory lost to training."""
    async with tool_server() as (server, client):
        instances = await asyncio.gather(*(client.create_instance("calculator", f"t{i}") for i in range(100)))
        results = await asyncio.gather(*(client.execute(i, json.dumps({"expression": "6*7"})) for i in instances),
                                       return_exceptions=True)
        assert [getattr(r, "content", r) for r in results] == ["42"] * 100
        assert server.instances.running_executions == 0 and server.instances.queued_executions == 0


def at_gate(client: GrpcToolClient, instance: str, name: str) -> asyncio.Task:
    return asyncio.create_task(client.execute(instance, json.dumps({"name": name})))


async def test_calls_past_the_running_limit_wait_in_a_bounded_queue_shown_in_the_metrics() -> None:
    async with gated_server("queue", running=2, queued=3) as (server, client, metrics):
        instances = [await client.create_instance("wait_at_gate", f"t{i}") for i in range(6)]
        held = [at_gate(client, i, "queue") for i in instances[:5]]
        await until(lambda: server.instances.queued_executions == 3)
        assert server.instances.running_executions == 2
        assert metrics.value("agentloop_tool_running_executions") == 2
        assert metrics.value("agentloop_tool_queued_executions") == 3
        assert metrics.value("agentloop_tool_max_queued_executions") == 3
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:  # no retries: the bare answer
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await tool_pb2_grpc.ToolExecuteStub(channel).Execute(
                    tool_pb2.ExecuteRequest(instance_id=instances[5], arguments_json=json.dumps({"name": "queue"})),
                    timeout=30)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "2 tool executions are running and 3 are queued" in refused.value.details()
        assert FULL_METADATA in tuple(refused.value.trailing_metadata())
        gate("queue").set()
        assert [r.content for r in await asyncio.gather(*held)] == ["passed queue"] * 5
        assert metrics.value("agentloop_tool_queued_executions") == 0


async def test_the_client_retries_a_full_server_until_a_slot_frees() -> None:
    async with gated_server("retry", running=1, queued=0) as (server, client, metrics):
        calc = await client.create_instance("calculator", "waiter")
        async with slots_held(server, "retry"):
            waiting = asyncio.create_task(client.execute(calc, json.dumps({"expression": "6*7"})))
            refused = ("agentloop_server_requests_total", {"method": "Execute", "code": "RESOURCE_EXHAUSTED"})
            await until(lambda: metrics.value(refused[0], **refused[1]) >= 2)  # refused, backed off, refused again
            assert not waiting.done()
        assert (await waiting).content == "42"


async def test_a_refusal_that_lasts_to_the_deadline_is_reported_as_overload() -> None:
    async with gated_server("deadline", running=1, queued=0, timeout_s=1.0) as (server, client, _):
        calc = await client.create_instance("calculator", "late")
        async with slots_held(server, "deadline"):
            with pytest.raises(ToolServerOverloadedError) as raised:
                await client.execute(calc, json.dumps({"expression": "6*7"}))
    assert isinstance(raised.value, ToolInfrastructureError)  # never trained on as the model's error
    first, details = str(raised.value).split("\n")
    assert first == "tool server overloaded: Execute refused as full until its deadline"
    assert details.startswith("RESOURCE_EXHAUSTED") and "1 tool executions are running" in details


async def test_a_call_queued_until_near_its_deadline_is_refused_as_overload_not_a_timeout() -> None:
    """A queued call whose deadline passed in the queue read DEADLINE_EXCEEDED, a cause the report could not tell
    from a hung tool; the server refuses it as full just before, having run nothing."""
    async with gated_server("near", running=1, queued=5, timeout_s=4.0) as (server, client, metrics):
        calc = await client.create_instance("calculator", "queued")
        async with slots_held(server, "near"):
            with pytest.raises(ToolServerOverloadedError, match=r"^tool server overloaded: Execute refused"):
                await client.execute(calc, json.dumps({"expression": "6*7"}))
            assert metrics.value("agentloop_server_requests_total", method="Execute", code="RESOURCE_EXHAUSTED") >= 1
            assert server.instances.queued_executions == 0


async def test_the_in_process_client_reports_a_full_manager_as_overload_not_a_request_error() -> None:
    """It turned every server error into ToolRequestError, so a full server read as the caller's bug."""
    client = InProcessToolClient(InstanceManager(build_tools(load_config(BUILTIN)), ToolLimits(max_instances=1)))
    try:
        await client.create_instance("calculator", "t")
        with pytest.raises(ToolServerOverloadedError, match=r"(?s)tool server overloaded: create .*1 tool instances"):
            await client.create_instance("calculator", "t")
    finally:
        await client.close()
