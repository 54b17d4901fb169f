"""The Fleet's answers in domain types: what each server answered a control call, read out of its protobuf reply
so that callers of the Fleet never handle protobuf messages (as the Router's callers never do)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from agentloop_grpc.common.types import EngineState, PauseResult, ServerFacts
from agentloop_grpc.v1 import engine_pb2, generation_pb2

_FACTS = tuple(f.name for f in dataclasses.fields(ServerFacts))  # named as GetServerInfoResponse's fields
_STATES = {
    engine_pb2.ENGINE_STATE_LOADING: EngineState.LOADING,
    engine_pb2.ENGINE_STATE_RUNNING: EngineState.RUNNING,
    engine_pb2.ENGINE_STATE_PAUSED: EngineState.PAUSED,
    engine_pb2.ENGINE_STATE_SLEEPING: EngineState.SLEEPING,
    engine_pb2.ENGINE_STATE_DRAINING: EngineState.DRAINING,
}


@dataclass(frozen=True, slots=True)
class ServerInfo(ServerFacts):
    """What GetServerInfo answers: the engine's facts (their defaults while it loads), its state and the weight
    version it serves."""

    #: None: the server named no state.
    state: EngineState | None = field(kw_only=True)
    weight_version: int = field(kw_only=True)


@dataclass(frozen=True, slots=True)
class WeightsApplied:
    """A server's answer to a weight update (UpdateWeights, LoadWeights, ReceiveWeights), once applied."""

    weight_version: int
    tensors_updated: int
    #: Bytes of the tensors: received (a stream, a group's broadcast) or read from the checkpoint (LoadWeights).
    bytes_applied: int


def server_info(reply: engine_pb2.GetServerInfoResponse) -> ServerInfo:
    facts = {name: getattr(reply, name) for name in _FACTS}
    facts["eos_token_ids"] = tuple(reply.eos_token_ids)
    return ServerInfo(**facts, state=_STATES.get(reply.state), weight_version=reply.weight_version)


def weights_applied(
    reply: engine_pb2.UpdateWeightsResponse | engine_pb2.ReceiveWeightsResponse | engine_pb2.LoadWeightsResponse,
) -> WeightsApplied:
    moved = reply.bytes_read if isinstance(reply, engine_pb2.LoadWeightsResponse) else reply.bytes_received
    return WeightsApplied(reply.weight_version, reply.tensors_updated, moved)


def pause_result(reply: engine_pb2.PauseResponse) -> PauseResult:
    return PauseResult(aborted_requests=reply.aborted_requests, kept_requests=reply.kept_requests)


def engine_state(reply: engine_pb2.WakeUpResponse | engine_pb2.ResumeResponse) -> EngineState | None:
    return _STATES.get(reply.state)


def aborted(reply: generation_pb2.AbortResponse) -> tuple[str, ...]:
    """The ids of the requests an Abort found in flight and aborted."""
    return tuple(reply.aborted_request_ids)


def memory_released(reply: engine_pb2.SleepResponse) -> bool:
    return reply.memory_released


def ranks(reply: engine_pb2.JoinWeightGroupResponse) -> tuple[int, ...]:
    """The server's ranks in the weight group it joined."""
    return tuple(reply.ranks)


def nothing(reply: object) -> None:
    """The answer of a call whose reply is an empty message."""
