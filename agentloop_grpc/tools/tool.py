"""The Tool protocol (a tool with per-trajectory instances) and FunctionTool (a plain typed function as a tool).

A tool that needs the conversation it is called from (the turn, the messages so far) says so in its spec
(``wants_loop_state``): the loop then sends a LoopSnapshot with each of its calls, and ``execute`` receives it as
``loop_state``. A FunctionTool asks by declaring a parameter annotated ``LoopSnapshot``, which the model never sees.

Exceptions raised by a tool's work become tool-error results (``result.exception_result``), so the model reads
them; the server itself never turns them into gRPC errors.
"""

from __future__ import annotations

import asyncio
import inspect
import types
import typing
from collections.abc import Callable
from typing import Any, Protocol

from .result import LoopSnapshot, RewardResult, ToolResult, ToolSpec, exception_result, timeout_result, to_result
from .schema import function_schema
from .workers import WorkerPool


class Tool(Protocol):
    """A tool. ``create`` makes the state of one instance (one trajectory); the other calls receive it. ``close``
    frees what the tool holds for the server's lifetime (worker processes, folders) when the server stops. A tool
    whose ``spec.wants_loop_state`` is set is called ``execute(state, arguments, loop_state=LoopSnapshot)``."""

    spec: ToolSpec

    async def create(self, trajectory_id: str, kwargs: dict[str, Any]) -> Any: ...

    async def execute(self, state: Any, arguments: dict[str, Any]) -> ToolResult: ...

    async def reward(self, state: Any) -> RewardResult: ...

    async def release(self, state: Any) -> None: ...

    async def close(self) -> None: ...


class FunctionTool:
    """A stateless tool from a typed function (sync or async) whose return value is the response text.

    A sync function runs in worker processes (``workers.py``), so CPU-heavy work cannot stall the caller's event
    loop; it must therefore be defined at a module's top level. An async function runs on the event loop and must
    not block it. Either is stopped after ``timeout_s`` and the model reads a TIMEOUT tool error.
    """

    def __init__(self, function: Callable[..., Any], name: str | None = None, timeout_s: float = 10.0,
                 workers: int = 4) -> None:
        self._state_parameter = _loop_state_parameter(function)
        skip = () if self._state_parameter is None else (self._state_parameter,)
        description, parameters = function_schema(function, skip)
        self.spec = ToolSpec(name=name or function.__name__, description=description, parameters=parameters,
                             wants_loop_state=self._state_parameter is not None)
        self._function = function
        self._timeout_s = timeout_s
        self._pool = None if inspect.iscoroutinefunction(function) else WorkerPool(
            function, self.spec.name, workers, timeout_s
        )

    async def create(self, trajectory_id: str, kwargs: dict[str, Any]) -> None:
        if kwargs:
            raise ValueError(f"tool {self.spec.name!r} takes no creation arguments, got {sorted(kwargs)}")

    async def execute(self, state: None, arguments: dict[str, Any],
                      loop_state: LoopSnapshot | None = None) -> ToolResult:
        if self._state_parameter is not None:
            arguments = {**arguments, self._state_parameter: loop_state}
        if self._pool is not None:
            return await self._pool.call(arguments)
        deadline = asyncio.timeout(self._timeout_s)
        try:
            async with deadline:
                return to_result(await self._function(**arguments))
        except Exception as error:  # noqa: BLE001 - the tool's failure is the model's to read
            return timeout_result(self.spec.name, self._timeout_s) if deadline.expired() else exception_result(error)

    async def reward(self, state: None) -> RewardResult:
        return RewardResult(0.0)

    async def release(self, state: None) -> None:
        return None

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()


def _loop_state_parameter(function: Callable[..., Any]) -> str | None:
    """The parameter annotated ``LoopSnapshot`` (or ``LoopSnapshot | None``) that receives the loop's state."""
    hints = typing.get_type_hints(function)
    names = [name for name, hint in hints.items() if name != "return" and (
        hint is LoopSnapshot or (typing.get_origin(hint) in (typing.Union, types.UnionType)
                                 and LoopSnapshot in typing.get_args(hint)))]
    if len(names) > 1:
        raise TypeError(f"{function.__name__}: at most one parameter receives the loop's state, got {names}")
    return names[0] if names else None
