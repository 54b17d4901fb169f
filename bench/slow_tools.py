"""A tool with a latency, for bench/train_async.py: another tool whose every call first waits a time drawn from a
lognormal distribution (heavy-tailed, as sandboxed tool calls, test runs and web requests are), from a seeded
generator, so runs with the same seed draw the same latencies in the order the calls arrive.

Served by the ToolExecute server like any class tool (the bench puts bench/ on the server's PYTHONPATH):

    tools:
      - class: slow_tools:Delayed
        kwargs: {tool: "agentloop_grpc.tools.builtin.calculator:calculator", seed: 0, median_s: 4.0, sigma: 1.0,
                 max_s: 40.0}
"""

from __future__ import annotations

import asyncio
import importlib
import math
import random
from typing import Any

from agentloop_grpc.tools.result import RewardResult, ToolResult
from agentloop_grpc.tools.tool import FunctionTool, Tool


class Delayed:
    """``tool`` (module:function or module:Class) with ``lognormal(log(median_s), sigma)`` seconds, at most ``max_s``,
    waited before each call runs; everything else is the tool's own."""

    def __init__(self, tool: str, seed: int, median_s: float, sigma: float, max_s: float) -> None:
        module, _, name = tool.partition(":")
        target = getattr(importlib.import_module(module), name)
        self._inner: Tool = target() if isinstance(target, type) else FunctionTool(target)
        self.spec = self._inner.spec
        self._rng = random.Random(f"{seed}/{self.spec.name}")  # one stream per tool: calls of another don't shift it
        self._mu, self._sigma, self._max_s = math.log(median_s), sigma, max_s

    async def create(self, trajectory_id: str, kwargs: dict[str, Any]) -> Any:
        return await self._inner.create(trajectory_id, kwargs)

    async def execute(self, state: Any, arguments: dict[str, Any]) -> ToolResult:
        await asyncio.sleep(min(self._rng.lognormvariate(self._mu, self._sigma), self._max_s))
        return await self._inner.execute(state, arguments)

    async def reward(self, state: Any) -> RewardResult:
        return await self._inner.reward(state)

    async def release(self, state: Any) -> None:
        await self._inner.release(state)

    async def close(self) -> None:
        await self._inner.close()
