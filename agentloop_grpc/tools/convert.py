"""Conversion between agentloop.v1 tool messages and the tool domain types (both directions)."""

from __future__ import annotations

import json

from agentloop_grpc.v1 import tool_pb2

from .result import LoopSnapshot, RewardResult, ToolErrorKind, ToolImage, ToolResult, ToolSpec

ERROR_KINDS = {
    ToolErrorKind.INVALID_ARGUMENTS: tool_pb2.TOOL_ERROR_KIND_INVALID_ARGUMENTS,
    ToolErrorKind.EXCEPTION: tool_pb2.TOOL_ERROR_KIND_EXCEPTION,
    ToolErrorKind.TIMEOUT: tool_pb2.TOOL_ERROR_KIND_TIMEOUT,
    ToolErrorKind.RESOURCE_LIMIT: tool_pb2.TOOL_ERROR_KIND_RESOURCE_LIMIT,
}
_ERROR_KINDS_FROM_PROTO = {code: kind for kind, code in ERROR_KINDS.items()}


def spec_to_proto(spec: ToolSpec) -> tool_pb2.ToolSpec:
    return tool_pb2.ToolSpec(
        name=spec.name, description=spec.description, parameters_json_schema=json.dumps(spec.parameters),
        wants_loop_state=spec.wants_loop_state,
    )


def spec_from_proto(spec: tool_pb2.ToolSpec) -> ToolSpec:
    return ToolSpec(name=spec.name, description=spec.description, parameters=json.loads(spec.parameters_json_schema),
                    wants_loop_state=spec.wants_loop_state)


def loop_state_to_proto(snapshot: LoopSnapshot) -> tool_pb2.LoopState:
    return tool_pb2.LoopState(trajectory_id=snapshot.trajectory_id, turn=snapshot.turn,
                              messages_json=json.dumps(snapshot.messages, default=str))


def result_to_proto(result: ToolResult) -> tool_pb2.ExecuteResponse:
    response = tool_pb2.ExecuteResponse(
        content=result.content,
        step_reward=result.step_reward,
        metrics=result.metrics,
        images=[tool_pb2.ToolImage(mime_type=i.mime_type, data=i.data) for i in result.images],
    )
    if result.error_kind is not None:
        response.tool_error.CopyFrom(tool_pb2.ToolError(kind=ERROR_KINDS[result.error_kind], message=result.content))
    return response


def result_from_proto(response: tool_pb2.ExecuteResponse) -> ToolResult:
    error_kind = None
    if response.HasField("tool_error"):
        error_kind = _ERROR_KINDS_FROM_PROTO.get(response.tool_error.kind, ToolErrorKind.EXCEPTION)
    return ToolResult(
        content=response.content,
        error_kind=error_kind,
        step_reward=response.step_reward,
        metrics=dict(response.metrics),
        images=tuple(ToolImage(i.mime_type, i.data) for i in response.images),
    )


def reward_from_proto(response: tool_pb2.CalcRewardResponse) -> RewardResult:
    return RewardResult(response.reward, dict(response.metrics))
