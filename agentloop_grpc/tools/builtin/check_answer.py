"""check_answer: the model submits its final numeric answer; the instance compares it with the ground truth.

The ground truth comes with CreateInstance (``{"ground_truth": "42"}``); CalcReward returns 1.0 when the last
submitted answer equals it (numerically, within a relative tolerance), else 0.0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..result import RewardResult, ToolErrorKind, ToolResult, ToolSpec

RELATIVE_TOLERANCE = 1e-6
NUMBER_PATTERN = r"^-?[0-9][0-9,]{0,15}(\.[0-9]{0,8})?$"


def parse_number(text: str) -> float:
    cleaned = text.strip().replace(",", "").rstrip(".")
    return float(cleaned)


@dataclass
class _State:
    ground_truth: float
    answer: float | None = None


class CheckAnswer:
    """The check_answer tool."""

    def __init__(self) -> None:
        self.spec = ToolSpec(
            name="check_answer",
            description="Submit your final numeric answer. It is compared with the correct answer.",
            parameters={
                "type": "object",
                "properties": {
                    "answer": {
                        "type": "string", "description": "The final answer, a number.", "pattern": NUMBER_PATTERN
                    }
                },
                "required": ["answer"],
                "additionalProperties": False,
            },
        )

    async def create(self, trajectory_id: str, kwargs: dict[str, Any]) -> _State:
        if "ground_truth" not in kwargs:
            raise ValueError("check_answer needs {'ground_truth': ...} at CreateInstance")
        return _State(ground_truth=parse_number(str(kwargs["ground_truth"])))

    async def execute(self, state: _State, arguments: dict[str, Any]) -> ToolResult:
        try:
            state.answer = parse_number(arguments["answer"])
        except ValueError:
            return ToolResult.error(ToolErrorKind.INVALID_ARGUMENTS, f"{arguments['answer']!r} is not a number")
        correct = self._correct(state)
        return ToolResult(content="Correct." if correct else "Incorrect.", step_reward=1.0 if correct else 0.0)

    def _correct(self, state: _State) -> bool:
        return state.answer is not None and math.isclose(
            state.answer, state.ground_truth, rel_tol=RELATIVE_TOLERANCE, abs_tol=RELATIVE_TOLERANCE
        )

    async def reward(self, state: _State) -> RewardResult:
        correct = self._correct(state)
        return RewardResult(1.0 if correct else 0.0, {"answered": float(state.answer is not None)})

    async def release(self, state: _State) -> None:
        return None

    async def close(self) -> None:
        return None
