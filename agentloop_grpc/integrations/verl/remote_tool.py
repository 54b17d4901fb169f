"""ToolExecuteTool: a verl tool (``verl.tools.base_tool.BaseTool``) whose work runs on a ToolExecute server
(``agentloop tools serve``), so verl's own ``ToolAgentLoop`` and tool YAML reach our tools with no glue:

```yaml
tools:
  - class_name: agentloop_grpc.integrations.verl.remote_tool.ToolExecuteTool
    config: {type: native, address: "localhost:50061", tool_name: calculator}   # tool_schema: optional
```

At start the server's ListTools is read once, and the server's schema is the truth: ``tool_name`` must be a tool it
hosts, and a ``tool_schema`` given in the YAML must equal the server's as verl models it (a ValueError names each
field that differs); without one, the server's is the schema verl shows the model.

Lifecycle: ``create`` -> a handle, whose CreateInstance (``create_kwargs`` passed on, under the loop's request id as
the trajectory id) goes with its first ``execute`` or ``calc_reward``; ``execute`` -> Execute (the arguments as
JSON); ``calc_reward`` -> CalcReward; ``release`` -> ReleaseInstance (best effort: the server's instance TTL reaps
what a failed release leaves). verl 0.9.1's ToolAgentLoop creates and releases an instance around every call; a loop
that keeps one instance per trajectory gets one server instance per trajectory.

Results: the text, the images decoded to PIL (what verl's processors take), the step reward as verl's tool reward and
the metrics as its tool metrics; a tool's own error is text the model reads (``Error (kind): message``, as in our
loops), and so is an image that does not decode. A tool whose spec asks for the loop's state gets it from verl's
``agent_data`` (its request id, turn and messages).

Failures outside the model's control (``ToolInfrastructureError``: the server down, a deadline, an instance lost,
overload; ``ToolRequestError``: creation arguments the tool refuses) must not be trained on. verl 0.9.1's
ToolAgentLoop turns anything ``create`` or ``execute`` raises into the text "Error executing tool ..." that the model
reads and is trained on, and verl has no way to drop one row of a batch: ``extra_fields`` only become columns, and a
row kept with a zero mask still enters its GRPO group's mean and std. So, as for our own loops in verl (``batch.py``'s
``FailedTrajectoriesError``), the rollout step stops, naming the tool and the cause: the handle records the failure,
``execute`` raises it, and ``release``, which verl calls in a ``finally`` outside its ``except``, raises
``UntrainableToolCallError``. CreateInstance waits for ``execute`` for the same reason: what ``create`` raises becomes
text, and no ``release`` follows it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal
from uuid import uuid4

import pydantic
from pydantic import BaseModel, ConfigDict, Field
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
from verl.utils.rollout_trace import rollout_trace_op

from agentloop_grpc.agent.images import Picture
from agentloop_grpc.client_security import ClientSecurity
from agentloop_grpc.common.media import ImageError
from agentloop_grpc.integrations.background_loop import BackgroundLoop
from agentloop_grpc.tools.client import GrpcToolClient, ToolInfrastructureError, ToolRequestError
from agentloop_grpc.tools.result import LoopSnapshot, ToolResult, ToolSpec

log = logging.getLogger(__name__)

#: The cause of a request the server refused (creation arguments a tool rejects): a data or config bug.
REQUEST_REFUSED = "tool_request_refused"


class RemoteToolConfig(BaseModel):
    """A ToolExecuteTool's ``config`` in verl's tool YAML; unknown keys are refused by name."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["native"] = "native"
    """verl's tool type (its loader reads it; verl 0.9.1 has ``native`` only)."""
    address: str
    """The ToolExecute server (host:port)."""
    tool_name: str | None = None
    """The server's tool; default: the name in the YAML's ``tool_schema``."""
    timeout_s: float = Field(60.0, gt=0)
    """The deadline of every call to the server, Execute's included."""
    security: ClientSecurity | None = None
    """TLS and tokens of the server (files or variable names), as our other clients take them."""


class UntrainableToolCallError(RuntimeError):
    """A call failed outside the model's control, so its trajectory must not be trained on. ``cause``: the client's
    slug for infrastructure (``tool_server_unavailable``, ``tool_deadline``, ...), ``tool_request_refused``, or the
    error's type."""

    def __init__(self, tool_name: str, cause: str, detail: str) -> None:
        super().__init__(f"tool {tool_name!r}: {cause}: {detail} (not the model's mistake, so the trajectory must not "
                         "be trained on, and verl cannot drop one row of a batch: the rollout step stops)")
        self.tool_name, self.cause, self.detail = tool_name, cause, detail

    def __reduce__(self) -> tuple[type[UntrainableToolCallError], tuple[str, str, str]]:
        # rebuilt from its fields when Ray carries it from the agent-loop worker to the trainer
        return type(self), (self.tool_name, self.cause, self.detail)

    @classmethod
    def of(cls, tool_name: str, error: Exception) -> UntrainableToolCallError:
        if isinstance(error, ToolInfrastructureError):
            cause = error.cause
        elif isinstance(error, ToolRequestError):
            cause = REQUEST_REFUSED
        else:
            cause = type(error).__name__
        return cls(tool_name, cause, str(error))


@dataclass(slots=True)
class _Instance:
    """One verl instance: its creation arguments, the server's instance once created, the failure once one
    happened."""

    create_kwargs: dict[str, Any]
    server_id: str | None = None
    failure: UntrainableToolCallError | None = None
    creating: asyncio.Lock = field(default_factory=asyncio.Lock)


def served_spec(config: RemoteToolConfig, name: str) -> ToolSpec:
    """The server's spec of tool ``name``, read by ListTools; ValueError naming the hosted tools if it has none."""
    async def listed() -> list[ToolSpec]:
        client = GrpcToolClient(config.address, config.timeout_s, config.security)
        try:
            return await client.list_tools()
        finally:
            await client.close()

    # verl builds its tools synchronously, maybe inside a running event loop: the call runs on a loop of its own
    loop = BackgroundLoop("verl-tool-start")
    try:
        specs = {spec.name: spec for spec in loop.run(listed())}
    except ToolInfrastructureError as error:
        raise ConnectionError(f"the tool server at {config.address} did not list its tools: {error}") from error
    finally:
        loop.close()
    if name not in specs:
        raise ValueError(f"the tool server at {config.address} hosts no tool {name!r}; it hosts {sorted(specs)}")
    return specs[name]


def verl_schema(spec: ToolSpec) -> OpenAIFunctionToolSchema:
    """``spec`` as verl models a tool schema (verl keeps each property's type, description and enum only)."""
    try:
        return OpenAIFunctionToolSchema.model_validate(spec.openai())
    except pydantic.ValidationError as error:
        raise ValueError(f"the server's schema of {spec.name!r} does not fit verl's tool schema model (every "
                         f"property needs a type): {error}") from error


def differences(given: Any, served: Any, path: str = "") -> list[str]:
    """Where two schemas (as dumped dicts) differ, one line per field."""
    if isinstance(given, dict) and isinstance(served, dict):
        return [line for key in sorted(given.keys() | served.keys())
                for line in differences(given.get(key), served.get(key), f"{path}.{key}" if path else key)]
    return [] if given == served else [f"{path}: {given!r} in the YAML, {served!r} on the server"]


def tool_response(result: ToolResult) -> ToolResponse:
    """What verl's loop shows the model for ``result``."""
    if result.error_kind is not None:
        return ToolResponse(text=f"Error ({result.error_kind.value}): {result.content}")
    try:
        pictures = [Picture.decode(image.data, image.mime_type).image for image in result.images]
    except ImageError as error:  # the tool's fault, so the model reads it as the tool's error (as in our loops)
        return ToolResponse(text=f"Error (invalid image): {error}")
    # verl's ToolResponse refuses image=None, so the key is left out when there are none
    return ToolResponse(text=result.content, **({"image": pictures} if pictures else {}))


class ToolExecuteTool(BaseTool):
    """One tool of a ToolExecute server as a verl tool (see the module docstring). ``close`` closes its channel;
    verl never closes its tools, so their channels live as long as the worker."""

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None) -> None:
        settings = RemoteToolConfig.model_validate(config)
        name = settings.tool_name or (tool_schema.function.name if tool_schema is not None else None)
        if name is None:
            raise ValueError("ToolExecuteTool: give config.tool_name (the server's tool) or a tool_schema")
        self.settings = settings
        self.spec = served_spec(settings, name)
        served = verl_schema(self.spec)
        if tool_schema is not None:
            found = differences(tool_schema.model_dump(), served.model_dump())
            if found:
                raise ValueError(f"tool_schema of {name!r} differs from what the tool server at {settings.address} "
                                 "lists (the server's is the truth; leave tool_schema out to take it): "
                                 + "; ".join(found))
        super().__init__(config, tool_schema or served)
        self._client: GrpcToolClient | None = None
        self._instances: dict[str, _Instance] = {}

    @property
    def live_instances(self) -> int:
        """Instances created and not yet released."""
        return len(self._instances)

    def _channel(self) -> GrpcToolClient:
        # opened on first use, on the loop verl calls from: an asyncio channel belongs to the loop it was opened on
        if self._client is None:
            self._client = GrpcToolClient(self.settings.address, self.settings.timeout_s, self.settings.security)
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    @contextmanager
    def _recorded(self, instance: _Instance) -> Iterator[None]:
        """Keeps what fails here on ``instance``, for ``release`` to raise past verl's ``except``."""
        if instance.failure is not None:
            raise instance.failure
        try:
            yield
        except Exception as error:
            instance.failure = UntrainableToolCallError.of(self.name, error)
            instance.failure.__cause__ = error
            raise

    async def _server_instance(self, instance: _Instance, trajectory_id: str) -> str:
        async with instance.creating:  # concurrent first calls create one server instance, not two
            if instance.server_id is None:
                instance.server_id = await self._channel().create_instance(self.spec.name, trajectory_id,
                                                                           instance.create_kwargs)
        return instance.server_id

    def _loop_state(self, agent_data: Any) -> LoopSnapshot | None:
        if not self.spec.wants_loop_state:
            return None
        if agent_data is None:
            raise ValueError(f"{self.name} wants the loop's state, and this loop passed no agent_data (verl's "
                             "ToolAgentLoop does)")
        return LoopSnapshot(agent_data.request_id, agent_data.assistant_turns - 1, tuple(agent_data.messages))

    async def create(self, instance_id: str | None = None, create_kwargs: dict[str, Any] | None = None,
                     **kwargs: Any) -> tuple[str, ToolResponse]:
        """A handle; ``create_kwargs`` (verl 0.9.1's convention) and any other keywords (older verl loops pass them
        bare) are the instance's creation arguments."""
        instance_id = instance_id or uuid4().hex
        if instance_id in self._instances:
            raise ValueError(f"{self.name} instance {instance_id!r} is live already")
        self._instances[instance_id] = _Instance({**kwargs, **(create_kwargs or {})})
        return instance_id, ToolResponse()

    @rollout_trace_op
    async def execute(self, instance_id: str, parameters: dict[str, Any],
                      **kwargs: Any) -> tuple[ToolResponse, float, dict]:
        instance = self._instances[instance_id]
        agent_data = kwargs.get("agent_data")
        with self._recorded(instance):
            trajectory_id = agent_data.request_id if agent_data is not None else instance_id
            server_id = await self._server_instance(instance, trajectory_id)
            result = await self._channel().execute(server_id, json.dumps(parameters),
                                                   loop_state=self._loop_state(agent_data))
        return tool_response(result), result.step_reward, dict(result.metrics)

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        instance = self._instances[instance_id]
        with self._recorded(instance):
            server_id = await self._server_instance(instance, instance_id)
            return (await self._channel().calc_reward(server_id)).reward

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        instance = self._instances.pop(instance_id)
        if instance.server_id is not None:
            try:
                await self._channel().release(instance.server_id)
            except (ToolInfrastructureError, ToolRequestError) as error:  # the server's instance TTL reaps it
                log.warning("releasing %s instance %s failed: %s", self.name, instance.server_id, error)
        if instance.failure is not None:
            raise instance.failure


__all__ = ["RemoteToolConfig", "ToolExecuteTool", "UntrainableToolCallError"]
