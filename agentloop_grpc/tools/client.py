"""ToolClient: how agent loops call tools, over gRPC or in process, through one interface.

Infrastructure failures (server down, deadline exceeded, instance lost, server bug) raise
ToolInfrastructureError: the trajectory is marked and excluded from training. A tool's own failure is a normal
ToolResult with ``error_kind`` set, which the model reads.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

import grpc

from agentloop_grpc.channels import open_channel
from agentloop_grpc.common.errors import EngineError
from agentloop_grpc.security import ClientSecurity
from agentloop_grpc.v1 import tool_pb2, tool_pb2_grpc

from . import convert
from .instances import InstanceManager
from .result import LoopSnapshot, RewardResult, ToolResult, ToolSpec


class ToolInfrastructureError(Exception):
    """The tool infrastructure failed (not the tool's work)."""


class ToolRequestError(Exception):
    """The client's request was wrong (unknown tool, bad creation arguments): a caller bug, not infrastructure."""


class ToolClient(Protocol):
    async def list_tools(self) -> list[ToolSpec]: ...

    async def create_instance(
        self, tool_name: str, trajectory_id: str, kwargs: dict[str, Any] | None = None
    ) -> str: ...

    async def execute(self, instance_id: str, arguments_json: str, call_id: str = "",
                      loop_state: LoopSnapshot | None = None) -> ToolResult:
        """One call; ``loop_state`` is given only for tools whose spec has ``wants_loop_state``."""
        ...

    async def calc_reward(self, instance_id: str) -> RewardResult: ...

    async def release(self, instance_id: str) -> None: ...


_REQUEST_CODES = {grpc.StatusCode.INVALID_ARGUMENT}


class GrpcToolClient:
    """ToolClient over a ToolExecute server (with TLS and a token when ``security`` says so); every call has a
    deadline."""

    def __init__(self, address: str, timeout_s: float = 60.0, security: ClientSecurity | None = None) -> None:
        self._channel = open_channel(address, security)
        self._stub = tool_pb2_grpc.ToolExecuteStub(self._channel)
        self._timeout = timeout_s

    async def close(self) -> None:
        await self._channel.close()

    async def _call(self, method: str, request):
        try:
            return await getattr(self._stub, method)(request, timeout=self._timeout)
        except grpc.aio.AioRpcError as error:
            message = f"{method}: {error.code().name}: {error.details()}"
            gone = method == "CreateInstance" and error.code() == grpc.StatusCode.NOT_FOUND
            if error.code() in _REQUEST_CODES or gone:
                raise ToolRequestError(message) from error
            raise ToolInfrastructureError(message) from error

    async def list_tools(self) -> list[ToolSpec]:
        response = await self._call("ListTools", tool_pb2.ListToolsRequest())
        return [convert.spec_from_proto(s) for s in response.tools]

    async def create_instance(self, tool_name: str, trajectory_id: str, kwargs: dict[str, Any] | None = None) -> str:
        request = tool_pb2.CreateInstanceRequest(
            tool_name=tool_name, trajectory_id=trajectory_id, create_kwargs_json=json.dumps(kwargs or {})
        )
        return (await self._call("CreateInstance", request)).instance_id

    async def execute(self, instance_id: str, arguments_json: str, call_id: str = "",
                      loop_state: LoopSnapshot | None = None) -> ToolResult:
        request = tool_pb2.ExecuteRequest(instance_id=instance_id, arguments_json=arguments_json, call_id=call_id)
        if loop_state is not None:  # unset otherwise: tools that do not ask cost nothing on the wire
            request.loop_state.CopyFrom(convert.loop_state_to_proto(loop_state))
        return convert.result_from_proto(await self._call("Execute", request))

    async def calc_reward(self, instance_id: str) -> RewardResult:
        request = tool_pb2.CalcRewardRequest(instance_id=instance_id)
        return convert.reward_from_proto(await self._call("CalcReward", request))

    async def release(self, instance_id: str) -> None:
        await self._call("ReleaseInstance", tool_pb2.ReleaseInstanceRequest(instance_id=instance_id))


class InProcessToolClient:
    """The same interface over tools in this process (functions that need no isolation); ``close`` stops the
    tools' worker processes."""

    def __init__(self, instances: InstanceManager) -> None:
        self._instances = instances

    async def close(self) -> None:
        await self._instances.close()

    async def _call(self, coroutine):
        try:
            return await coroutine
        except EngineError as error:
            raise ToolRequestError(str(error)) from error

    async def list_tools(self) -> list[ToolSpec]:
        return self._instances.specs()

    async def create_instance(self, tool_name: str, trajectory_id: str, kwargs: dict[str, Any] | None = None) -> str:
        return await self._call(self._instances.create(tool_name, trajectory_id, json.dumps(kwargs or {})))

    async def execute(self, instance_id: str, arguments_json: str, call_id: str = "",
                      loop_state: LoopSnapshot | None = None) -> ToolResult:
        return await self._call(self._instances.execute(instance_id, arguments_json, loop_state))

    async def calc_reward(self, instance_id: str) -> RewardResult:
        return await self._call(self._instances.reward(instance_id))

    async def release(self, instance_id: str) -> None:
        await self._instances.release(instance_id)
