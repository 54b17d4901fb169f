"""The AgentLoop protocol and LoopRegistry: loops selected per sample by name from an explicit object.

No import side effects and no global state: whoever builds a worker builds its registry
(``LoopRegistry.default(context)`` gives ``single_turn`` and ``tool``) and may add loops of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from ..context import LoopContext
from ..sample import Sample
from ..trajectory import Trajectory


class AgentLoop(Protocol):
    async def run(self, sample: Sample) -> Trajectory: ...


class LoopRegistry:
    """Loops by name (immutable once built)."""

    def __init__(self, loops: Mapping[str, AgentLoop]) -> None:
        self._loops = dict(loops)

    @classmethod
    def default(cls, context: LoopContext) -> LoopRegistry:
        from .single_turn import SingleTurnLoop
        from .tool_loop import ToolLoop

        return cls({"single_turn": SingleTurnLoop(context), "tool": ToolLoop(context)})

    def with_loop(self, name: str, loop: AgentLoop) -> LoopRegistry:
        return LoopRegistry({**self._loops, name: loop})

    def get(self, name: str) -> AgentLoop:
        try:
            return self._loops[name]
        except KeyError:
            raise KeyError(f"no loop named {name!r}; known: {sorted(self._loops)}") from None

    def names(self) -> list[str]:
        return sorted(self._loops)
