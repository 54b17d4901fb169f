"""What a tool call returns: text for the model, optional images, and a tool-error mark when the work failed.

A tool's exceptions and time-outs become tool-error results through the formatters at the end, in one place, so
the model reads them and the server never turns them into gRPC errors.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class ToolErrorKind(enum.Enum):
    """Why a tool's work failed (mirrors agentloop.v1.ToolErrorKind)."""

    INVALID_ARGUMENTS = "invalid_arguments"
    EXCEPTION = "exception"
    TIMEOUT = "timeout"
    RESOURCE_LIMIT = "resource_limit"


@dataclass(frozen=True, slots=True)
class ToolImage:
    mime_type: str
    data: bytes = field(repr=False)


@dataclass(frozen=True, slots=True)
class ToolResult:
    """One tool call's outcome. ``error_kind`` is set when the tool's work failed; ``content`` then says why."""

    content: str
    error_kind: ToolErrorKind | None = None
    step_reward: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)
    images: tuple[ToolImage, ...] = ()

    @property
    def is_error(self) -> bool:
        return self.error_kind is not None

    @classmethod
    def error(cls, kind: ToolErrorKind, message: str) -> ToolResult:
        return cls(content=message, error_kind=kind)


@dataclass(frozen=True, slots=True)
class RewardResult:
    reward: float
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool as the model sees it: an OpenAI function."""

    name: str
    description: str
    parameters: dict
    #: The tool receives the loop's state (a LoopSnapshot) with every call; only such tools are sent it.
    wants_loop_state: bool = False

    def openai(self) -> dict:
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


@dataclass(frozen=True, slots=True)
class LoopSnapshot:
    """The agent loop's state at one tool call (agentloop.v1.LoopState), for tools whose spec wants it."""

    trajectory_id: str
    #: 0-based index of the assistant turn that made the call.
    turn: int
    #: The conversation so far (OpenAI chat messages), ending with the assistant message that holds the call.
    messages: tuple[dict[str, Any], ...]


def to_result(value: object) -> ToolResult:
    """A tool function's return value as a result: a ToolResult as it is, anything else as its text."""
    return value if isinstance(value, ToolResult) else ToolResult(content=str(value))


def exception_result(error: BaseException) -> ToolResult:
    """The one formatter of a tool's exception into what the model reads."""
    return ToolResult.error(ToolErrorKind.EXCEPTION, f"{type(error).__name__}: {error}")


def timeout_result(name: str, timeout_s: float) -> ToolResult:
    return ToolResult.error(ToolErrorKind.TIMEOUT, f"{name} ran longer than {timeout_s:g} s and was stopped")
