"""ToolClient: how agent loops call tools, over gRPC or in process, through one interface.

Infrastructure failures (server down, deadline exceeded, instance lost, server bug) raise
ToolInfrastructureError: the trajectory is marked and excluded from training. A tool's own failure is a normal
ToolResult with ``error_kind`` set, which the model reads.

A server too full to take a call (its execution queue or its instances at their limits) refuses it having run
nothing; the gRPC client backs off and tries again until the call's deadline, so a burst waits instead of losing
trajectories, and only a refusal that lasts to the deadline raises ToolServerOverloadedError (an infrastructure
failure whose message starts "tool server overloaded", so a rollout's report names the cause).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from typing import Any, Protocol

import grpc
from google.protobuf.message import Message

from agentloop_grpc.channels import open_channel
from agentloop_grpc.client_security import ClientSecurity
from agentloop_grpc.v1 import tool_pb2, tool_pb2_grpc

from . import convert
from .errors import FULL_METADATA, INFRASTRUCTURE_METADATA, ToolBackendError, ToolServerError, ToolServerFullError
from .instances import InstanceManager
from .result import LoopSnapshot, RewardResult, ToolResult, ToolSpec


class ToolInfrastructureError(Exception):
    """The tool infrastructure failed (not the tool's work). ``cause`` names what failed, for counting:
    ``tool_server_unavailable``, ``tool_deadline``, ``tool_instance_lost``, ``tool_server_overloaded``,
    ``tool_server_error``, or what the server said failed behind the tool (``mcp_server_crashed``, ...)."""

    def __init__(self, message: str, cause: str = "tool_server_error") -> None:
        super().__init__(message)
        self.cause = cause


class ToolServerOverloadedError(ToolInfrastructureError):
    """The tool server refused the call as full until its deadline: overload, neither the tool's nor the model's
    failure."""

    def __init__(self, what: str, details: str) -> None:
        # the first line is the cause a report groups by, so it holds no figures
        super().__init__(f"tool server overloaded: {what}\n{details}", "tool_server_overloaded")

    @classmethod
    def refused(cls, method: str, details: str, refusals: int, started: float) -> ToolServerOverloadedError:
        return cls(f"{method} refused as full until its deadline",
                   f"RESOURCE_EXHAUSTED {refusals} times in {time.monotonic() - started:.1f} s: {details}")


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
#: The first wait before retrying a call the server refused as full; each refusal doubles it, up to the cap.
FIRST_BACKOFF_S = 0.05
MAX_BACKOFF_S = 2.0


#: Calls that are safe to send again after UNAVAILABLE (a connection lost before the answer: a server that was
#: stalled, a keepalive that gave up on a transport while it resumed): a repeated CreateInstance at worst leaves an
#: instance the server's TTL releases; Execute is never repeated, since the tool may have run.
_REPEATABLE = frozenset({"ListTools", "CreateInstance", "CalcReward", "ReleaseInstance"})
#: Tries of a repeatable call that fails with UNAVAILABLE (the first included), within its deadline.
UNAVAILABLE_TRIES = 3


#: The cause of an infrastructure failure by status code, when the server did not name one.
_CAUSES = {grpc.StatusCode.UNAVAILABLE: "tool_server_unavailable", grpc.StatusCode.DEADLINE_EXCEEDED: "tool_deadline",
           grpc.StatusCode.NOT_FOUND: "tool_instance_lost"}


def _behind_tool(error: grpc.aio.AioRpcError) -> str | None:
    """The cause the server named for a failure of what a tool depends on (an MCP server), if it named one: the
    server tried already, so such a failure is not sent again."""
    for key, value in tuple(error.trailing_metadata() or ()):
        if key == INFRASTRUCTURE_METADATA:
            return str(value)
    return None


def _cause(error: grpc.aio.AioRpcError) -> str:
    """What failed: the cause the server named in its trailing metadata, else the status code's."""
    return _behind_tool(error) or _CAUSES.get(error.code(), "tool_server_error")


def _refused_as_full(error: grpc.aio.AioRpcError) -> bool:
    """The server refused the call having run nothing (not a RESOURCE_EXHAUSTED of gRPC's own, which may come
    after the tool ran)."""
    return error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and FULL_METADATA in tuple(
        error.trailing_metadata() or ())


class GrpcToolClient:
    """ToolClient over a ToolExecute server (with TLS and a token when ``security`` says so); every call has a
    deadline."""

    def __init__(self, address: str, timeout_s: float = 60.0, security: ClientSecurity | None = None) -> None:
        self._channel = open_channel(address, security)
        self._stub = tool_pb2_grpc.ToolExecuteStub(self._channel)
        self._timeout = timeout_s

    async def close(self) -> None:
        await self._channel.close()

    async def _call(self, method: str, request: Message) -> Any:
        started = time.monotonic()
        deadline = started + self._timeout
        refusals, backoff, tries = 0, FIRST_BACKOFF_S, 1
        while True:
            try:
                return await getattr(self._stub, method)(request, timeout=deadline - time.monotonic())
            except grpc.aio.AioRpcError as error:
                if (error.code() == grpc.StatusCode.UNAVAILABLE and method in _REPEATABLE and not _behind_tool(error)
                        and tries < UNAVAILABLE_TRIES and time.monotonic() + backoff < deadline):
                    tries += 1
                    await asyncio.sleep(backoff)
                    backoff = min(2 * backoff, MAX_BACKOFF_S)
                    continue
                if _refused_as_full(error):
                    refusals += 1
                    wait = backoff * random.uniform(0.5, 1.0)  # jitter: a burst refused together retries apart
                    if time.monotonic() + wait >= deadline:
                        raise ToolServerOverloadedError.refused(method, error.details() or "", refusals,
                                                                started) from error
                    await asyncio.sleep(wait)
                    backoff = min(2 * backoff, MAX_BACKOFF_S)
                    continue
                if refusals and error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:  # too little time left once in
                    raise ToolServerOverloadedError.refused(method, error.details() or "", refusals,
                                                            started) from error
                message = f"{method}: {error.code().name}: {error.details()}"
                if error.code() in _REQUEST_CODES or (method == "CreateInstance"
                                                      and error.code() == grpc.StatusCode.NOT_FOUND):
                    raise ToolRequestError(message) from error
                raise ToolInfrastructureError(message, _cause(error)) from error

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

    async def _call(self, coroutine: Any) -> Any:
        try:
            return await coroutine
        except ToolServerFullError as error:  # the queue is in this process: nothing to wait for but its limit
            raise ToolServerOverloadedError(f"{coroutine.__name__} refused as full (in process)", str(error)) from error
        except ToolBackendError as error:
            raise ToolInfrastructureError(str(error), error.cause) from error
        except ToolServerError as error:
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
