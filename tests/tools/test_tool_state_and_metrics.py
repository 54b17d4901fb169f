"""The loop's state for tools that ask for it, and tool metrics, across a real ToolExecute server on loopback."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import grpc
import pytest

from agentloop_grpc.tools.client import GrpcToolClient, ToolRequestError
from agentloop_grpc.tools.config import ToolServerConfig
from agentloop_grpc.tools.result import LoopSnapshot
from agentloop_grpc.tools.server import create_tool_server
from agentloop_grpc.tools.tool import FunctionTool
from agentloop_grpc.v1 import tool_pb2, tool_pb2_grpc

TOOLS = ["tests.tools.state_tool:whoami", "tests.tools.state_tool:measure"]
MESSAGES = ({"role": "user", "content": "who calls?"}, {"role": "assistant", "content": "", "tool_calls": []})


@pytest.fixture
async def served() -> AsyncIterator[tuple[GrpcToolClient, str]]:
    config = ToolServerConfig.model_validate({"tools": [{"function": f} for f in TOOLS]})
    server = await create_tool_server(config, "127.0.0.1:0")
    client = GrpcToolClient(f"127.0.0.1:{server.port}", timeout_s=30)
    try:
        yield client, f"127.0.0.1:{server.port}"
    finally:
        await client.close()
        await server.stop(grace_s=1)


async def test_list_tools_says_which_tool_wants_the_state_and_hides_its_parameter(served) -> None:
    client, _ = served
    specs = {s.name: s for s in await client.list_tools()}
    assert specs["whoami"].wants_loop_state and not specs["measure"].wants_loop_state
    assert list(specs["whoami"].parameters["properties"]) == ["question"]  # the model never fills the state


async def test_a_tool_reads_the_state_sent_with_its_call(served) -> None:
    client, _ = served
    instance = await client.create_instance("whoami", "traj-7")
    result = await client.execute(instance, json.dumps({"question": "?"}), "c1",
                                  loop_state=LoopSnapshot("traj-7", 2, MESSAGES))
    assert result.content == "traj-7 turn 2 after 2 messages; asked: who calls?" and not result.is_error
    assert result.metrics["messages"] == 2.0 and result.metrics["seconds"] >= 0.0


async def test_a_tool_that_wants_the_state_refuses_a_call_without_it(served) -> None:
    client, address = served
    instance = await client.create_instance("whoami", "t")
    with pytest.raises(ToolRequestError, match=r"INVALID_ARGUMENT.*loop_state"):
        await client.execute(instance, json.dumps({"question": "?"}))
    async with grpc.aio.insecure_channel(address) as channel:  # a state whose messages are not an array
        stub = tool_pb2_grpc.ToolExecuteStub(channel)
        request = tool_pb2.ExecuteRequest(instance_id=instance, arguments_json='{"question": "?"}',
                                          loop_state=tool_pb2.LoopState(trajectory_id="t", messages_json="{}"))
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stub.Execute(request, timeout=30)
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "loop_state.messages_json" in raised.value.details()


async def test_metrics_a_tool_returns_cross_the_contract(served) -> None:
    client, _ = served
    instance = await client.create_instance("measure", "t")
    result = await client.execute(instance, json.dumps({"text": "four"}))
    assert result.content == "4" and result.metrics["chars"] == 4.0 and "seconds" in result.metrics


def test_a_function_tool_without_a_state_parameter_does_not_ask() -> None:
    async def plain(text: str) -> str:
        """Echo.

        Args:
            text: The text.
        """
        return text

    assert not FunctionTool(plain).spec.wants_loop_state

    async def twice(a: LoopSnapshot, b: LoopSnapshot | None) -> str:
        return ""

    with pytest.raises(TypeError, match="at most one parameter"):
        FunctionTool(twice)
