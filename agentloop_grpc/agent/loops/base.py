"""The AgentLoop protocol and LoopRegistry: loops selected per sample by name from an explicit object.

No import side effects and no global state: whoever builds a worker builds its registry
(``LoopRegistry.default(context)`` gives ``single_turn`` and ``tool``) and may add loops of its own.

A loop of your own is a class (or factory) named by import path in ``WorkerSpec.loops`` or a rollout YAML's
``loops:``; each worker builds it once as ``Class(context, **kwargs)``: the worker's LoopContext (engines, codec,
tools, reward, tracer) first, then the loop's own config from the spec's kwargs. It needs one method,
``async run(sample) -> Trajectory``. Its name may not be a built-in's: a custom loop is added, never swapped in
silently for one other samples expect.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from ..context import LoopContext
from ..sample import Sample
from ..trajectory import Trajectory

#: The loops every registry has, by name (``LoopRegistry.default``).
BUILTIN_LOOPS = ("single_turn", "tool")


class AgentLoop(Protocol):
    async def run(self, sample: Sample) -> Trajectory: ...


class LoopRegistry:
    """Loops by name (immutable once built)."""

    def __init__(self, loops: Mapping[str, AgentLoop]) -> None:
        self._loops = dict(loops)

    @classmethod
    def default(cls, context: LoopContext, extra: Mapping[str, AgentLoop] | None = None) -> LoopRegistry:
        """The built-in loops on ``context``, and ``extra`` ones (ValueError if one takes a built-in's name)."""
        from .single_turn import SingleTurnLoop
        from .tool_loop import ToolLoop

        taken = sorted(set(extra or ()) & set(BUILTIN_LOOPS))
        if taken:
            raise ValueError(f"loops: {taken} are built-in loop names; give your loops other names")
        return cls({"single_turn": SingleTurnLoop(context), "tool": ToolLoop(context), **(extra or {})})

    def with_loop(self, name: str, loop: AgentLoop) -> LoopRegistry:
        return LoopRegistry({**self._loops, name: loop})

    def get(self, name: str) -> AgentLoop:
        try:
            return self._loops[name]
        except KeyError:
            raise KeyError(f"no loop named {name!r}; known: {sorted(self._loops)}") from None

    def names(self) -> list[str]:
        return sorted(self._loops)
