"""The Tool protocol (a tool with per-trajectory instances) and FunctionTool (a plain typed function as a tool).

Exceptions raised by a tool's work become tool-error results here, in one place, so the model reads them; the
server itself never turns them into gRPC errors.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any, Protocol

from .result import RewardResult, ToolErrorKind, ToolResult, ToolSpec
from .schema import function_schema


class Tool(Protocol):
    """A tool. ``create`` makes the state of one instance (one trajectory); the other calls receive it."""

    spec: ToolSpec

    async def create(self, trajectory_id: str, kwargs: dict[str, Any]) -> Any: ...

    async def execute(self, state: Any, arguments: dict[str, Any]) -> ToolResult: ...

    async def reward(self, state: Any) -> RewardResult: ...

    async def release(self, state: Any) -> None: ...


def exception_result(error: BaseException) -> ToolResult:
    """The one formatter of a tool's exception into what the model reads."""
    return ToolResult.error(ToolErrorKind.EXCEPTION, f"{type(error).__name__}: {error}")


class FunctionTool:
    """A stateless tool from a typed function (sync or async) whose return value is the response text."""

    def __init__(self, function: Callable[..., Any], name: str | None = None) -> None:
        description, parameters = function_schema(function)
        self.spec = ToolSpec(name=name or function.__name__, description=description, parameters=parameters)
        self._function = function

    async def create(self, trajectory_id: str, kwargs: dict[str, Any]) -> None:
        if kwargs:
            raise ValueError(f"tool {self.spec.name!r} takes no creation arguments, got {sorted(kwargs)}")

    async def execute(self, state: None, arguments: dict[str, Any]) -> ToolResult:
        try:
            if inspect.iscoroutinefunction(self._function):
                value = await self._function(**arguments)
            else:
                value = await asyncio.to_thread(self._function, **arguments)
        except Exception as error:  # noqa: BLE001 - the tool's failure is the model's to read
            return exception_result(error)
        return value if isinstance(value, ToolResult) else ToolResult(content=str(value))

    async def reward(self, state: None) -> RewardResult:
        return RewardResult(0.0)

    async def release(self, state: None) -> None:
        return None
