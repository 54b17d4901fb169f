"""VerlTool: one of verl's tools (a ``verl.tools.base_tool.BaseTool`` subclass) hosted by our ToolExecute server.

A verl tool YAML (``tools: [{class_name, config, tool_schema}]``) loads into our ``ToolServerConfig``: each entry
becomes a class tool naming this adapter (``tools/config.py``), so verl's tools run in the tool server's process,
out of the trainer and the loops, behind agentloop.v1 like our own.

Lifecycle, as verl's BaseTool documents it: CreateInstance -> ``create(create_kwargs=...)`` (verl 0.9.1's calling
convention) once per trajectory, Execute -> ``execute(instance_id, parameters)``, CalcReward -> ``calc_reward``,
ReleaseInstance -> ``release``. verl's tool loop passes ``agent_data`` to ``execute``; a tool on another process
cannot see the loop's state, so none is passed. A ToolResponse's images go as the result's images (a PIL image as
PNG, an encoded image's bytes as they are), after which the loop shows them to the model; videos, and pictures in
no form agentloop.v1 takes, are a tool error (the model reads it).
"""

from __future__ import annotations

import importlib
from numbers import Real
from typing import Any

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema

from agentloop_grpc.tools.result import RewardResult, ToolErrorKind, ToolImage, ToolResult, ToolSpec

from .picture_spans import encode_picture


def _tool_class(class_name: str) -> type[BaseTool]:
    module, _, name = class_name.rpartition(".")
    if not module:
        raise ValueError(f"class_name {class_name!r} is not of the form package.module.Class")
    cls = getattr(importlib.import_module(module), name)
    if not (isinstance(cls, type) and issubclass(cls, BaseTool)):
        raise ValueError(f"class_name {class_name!r} is not a subclass of verl.tools.base_tool.BaseTool")
    return cls


class VerlTool:
    """Our Tool protocol over one verl BaseTool (``class_name``, ``config``, ``tool_schema`` as in verl's YAML)."""

    def __init__(self, class_name: str, config: dict[str, Any] | None = None,
                 tool_schema: dict[str, Any] | None = None) -> None:
        config = dict(config or {})
        if config.get("type", "native") != "native":
            raise ValueError(f"{class_name}: config.type {config['type']!r} is not supported (verl has 'native' only)")
        schema = OpenAIFunctionToolSchema.model_validate(tool_schema) if tool_schema is not None else None
        self._tool = _tool_class(class_name)(config=config, tool_schema=schema)
        function = self._tool.get_openai_tool_schema().function
        # the YAML's own parameters when given: verl's schema model drops JSON-schema keys it does not model
        parameters = (tool_schema["function"].get("parameters") if tool_schema is not None else None) or \
            function.parameters.model_dump(exclude_unset=True, exclude_none=True)
        self.spec = ToolSpec(name=function.name, description=function.description, parameters=dict(parameters))

    async def create(self, trajectory_id: str, kwargs: dict[str, Any]) -> str:
        instance_id, _ = await self._tool.create(create_kwargs=dict(kwargs))
        return instance_id

    async def execute(self, state: str, arguments: dict[str, Any]) -> ToolResult:
        response, reward, metrics = await self._tool.execute(state, arguments)
        if response.video:
            return ToolResult.error(ToolErrorKind.EXCEPTION, f"{self.spec.name} returned videos, which agentloop.v1 "
                                    "does not carry")
        try:
            # verl's own loop skips a None in the list, so this does too
            pictures = [encode_picture(picture, f"{self.spec.name}'s image[{i}]")
                        for i, picture in enumerate(response.image or ()) if picture is not None]
            images = tuple(ToolImage(picture.mime_type, picture.data) for picture in pictures)
        except ValueError as error:
            return ToolResult.error(ToolErrorKind.EXCEPTION, str(error))
        numbers = {k: float(v) for k, v in (metrics or {}).items() if isinstance(v, Real) and not isinstance(v, bool)}
        return ToolResult(content=response.text or "", step_reward=float(reward or 0.0), metrics=numbers,
                          images=images)

    async def reward(self, state: str) -> RewardResult:
        return RewardResult(float(await self._tool.calc_reward(state)))

    async def release(self, state: str) -> None:
        await self._tool.release(state)

    async def close(self) -> None:
        return None
