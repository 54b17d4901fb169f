"""The agent loops: ``SingleTurnLoop`` and ``ToolLoop`` (the state machine), behind the ``AgentLoop`` protocol."""

from .base import AgentLoop, LoopRegistry
from .single_turn import SingleTurnLoop
from .tool_loop import LoopState, ToolLoop

__all__ = ["AgentLoop", "LoopRegistry", "LoopState", "SingleTurnLoop", "ToolLoop"]
