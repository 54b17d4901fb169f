"""Function tools' worker processes: bounded in time, stopped with their caller and with the server."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from agentloop_grpc.tools.client import GrpcToolClient, ToolInfrastructureError
from agentloop_grpc.tools.config import ToolServerConfig
from agentloop_grpc.tools.result import ToolErrorKind
from agentloop_grpc.tools.server import create_tool_server
from agentloop_grpc.tools.tool import FunctionTool

from .conftest import children
from .spin_tool import spin

pytestmark = pytest.mark.fault


def _workers(others: frozenset[int] = frozenset()) -> set[int]:
    """This process's tool workers, but for ``others`` (those of servers other tests in this process left)."""
    return children("agentloop_grpc.tools.workers") - others


async def _gone(others: frozenset[int] = frozenset(), deadline_s: float = 10.0) -> bool:
    stop = time.monotonic() + deadline_s
    while _workers(others) and time.monotonic() < stop:
        await asyncio.sleep(0.1)
    return not _workers(others)


async def test_work_its_caller_gave_up_on_stops_and_the_server_stop_ends_every_worker() -> None:
    config = ToolServerConfig.model_validate(
        {"tools": [{"function": "tests.tools.spin_tool:spin"}], "limits": {"function_timeout_s": 60}}
    )
    others = frozenset(_workers())
    server = await create_tool_server(config, "127.0.0.1:0")
    impatient = GrpcToolClient(f"127.0.0.1:{server.port}", timeout_s=2)
    try:
        instance = await impatient.create_instance("spin", "t")
        with pytest.raises(ToolInfrastructureError, match="DEADLINE_EXCEEDED"):
            await impatient.execute(instance, json.dumps({"seconds": 60}))
        assert await _gone(others), "the abandoned call's worker still burns CPU"
        assert (await impatient.execute(instance, json.dumps({"seconds": 0}))).content.isdigit()
        assert _workers(others)  # kept for the next call
    finally:
        await impatient.close()
        await server.stop(grace_s=1)
    assert await _gone(others)


async def test_an_async_function_tool_is_bounded_in_time_too() -> None:
    async def wait(seconds: float) -> str:
        """Wait.

        Args:
            seconds: How long.
        """
        await asyncio.sleep(seconds)
        return "waited"

    tool = FunctionTool(wait, timeout_s=0.5)
    assert (await tool.execute(None, {"seconds": 0})).content == "waited"
    result = await tool.execute(None, {"seconds": 30})
    assert result.error_kind is ToolErrorKind.TIMEOUT and result.content == "wait ran longer than 0.5 s and was stopped"


def test_a_sync_function_tool_must_be_importable_by_name() -> None:
    def local(x: int) -> str:
        """Local.

        Args:
            x: A number.
        """
        return str(x)

    with pytest.raises(TypeError, match="must be defined at a module's top level"):
        FunctionTool(local)
    FunctionTool(spin)
