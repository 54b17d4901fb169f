"""ToolExecuteServicer: agentloop.v1.ToolExecute over an InstanceManager; errors mapped in one place."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from agentloop_grpc.serving.status import map_errors
from agentloop_grpc.v1 import tool_pb2, tool_pb2_grpc

from . import convert
from .errors import FULL_METADATA, INFRASTRUCTURE_METADATA, ToolBackendError, ToolServerFullError
from .instances import InstanceManager, loop_snapshot

SERVICE_NAME = tool_pb2.DESCRIPTOR.services_by_name["ToolExecute"].full_name
#: How long before its deadline a queued call is refused (at most; a quarter of a short deadline), so the refusal
#: reaches the client in time to say "overloaded" instead of DEADLINE_EXCEEDED.
QUEUE_DEADLINE_MARGIN_S = 1.0


def queue_wait(time_remaining: float | None) -> float | None:
    """How long a call with ``time_remaining`` until its deadline may wait in the queue (None: no deadline)."""
    if time_remaining is None:
        return None
    return max(time_remaining - min(QUEUE_DEADLINE_MARGIN_S, time_remaining / 4), 0.0)


def _marks_metadata(handler: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """A refusal for a full server also says so in its trailing metadata, which is how a client knows that
    nothing ran and a retry is safe (see ``errors.FULL_METADATA``); a tool's backend failure says its cause there,
    which the client's infrastructure error carries (``errors.INFRASTRUCTURE_METADATA``)."""

    @functools.wraps(handler)
    async def marked(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await handler(self, request, context)
        except ToolServerFullError:
            context.set_trailing_metadata((FULL_METADATA,))
            raise
        except ToolBackendError as error:
            context.set_trailing_metadata(((INFRASTRUCTURE_METADATA, error.cause),))
            raise

    return marked


class ToolExecuteServicer(tool_pb2_grpc.ToolExecuteServicer):
    def __init__(self, instances: InstanceManager) -> None:
        self._instances = instances

    @map_errors
    async def ListTools(
        self, request: tool_pb2.ListToolsRequest, context: grpc.aio.ServicerContext
    ) -> tool_pb2.ListToolsResponse:
        return tool_pb2.ListToolsResponse(tools=[convert.spec_to_proto(s) for s in self._instances.specs()])

    @map_errors
    @_marks_metadata
    async def CreateInstance(
        self, request: tool_pb2.CreateInstanceRequest, context: grpc.aio.ServicerContext
    ) -> tool_pb2.CreateInstanceResponse:
        instance_id = await self._instances.create(request.tool_name, request.trajectory_id, request.create_kwargs_json)
        return tool_pb2.CreateInstanceResponse(instance_id=instance_id)

    @map_errors
    @_marks_metadata
    async def Execute(
        self, request: tool_pb2.ExecuteRequest, context: grpc.aio.ServicerContext
    ) -> tool_pb2.ExecuteResponse:
        state = request.loop_state
        loop_state = (loop_snapshot(state.trajectory_id, state.turn, state.messages_json)
                      if request.HasField("loop_state") else None)
        result = await self._instances.execute(request.instance_id, request.arguments_json, loop_state,
                                               queue_wait(context.time_remaining()))
        return convert.result_to_proto(result)

    @map_errors
    @_marks_metadata
    async def CalcReward(
        self, request: tool_pb2.CalcRewardRequest, context: grpc.aio.ServicerContext
    ) -> tool_pb2.CalcRewardResponse:
        reward = await self._instances.reward(request.instance_id)
        return tool_pb2.CalcRewardResponse(reward=reward.reward, metrics=reward.metrics)

    @map_errors
    async def ReleaseInstance(
        self, request: tool_pb2.ReleaseInstanceRequest, context: grpc.aio.ServicerContext
    ) -> tool_pb2.ReleaseInstanceResponse:
        await self._instances.release(request.instance_id)
        return tool_pb2.ReleaseInstanceResponse()
