"""Interactions: user simulators and environments that answer the model between turns.

An interaction is started per trajectory, answers each finished assistant turn with (done, content, score), gives
a final score, and is finished. The loop turns ``content`` into a user turn (encoded as the template's delta) and
records each score.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Protocol

from .sample import Sample


@dataclass(frozen=True, slots=True)
class InteractionTurn:
    done: bool
    content: str = ""
    score: float = 0.0


class Interaction(Protocol):
    async def start(self, sample: Sample) -> Any:
        """Make the state of one trajectory's interaction."""
        ...

    async def respond(self, state: Any, messages: list[dict[str, Any]]) -> InteractionTurn: ...

    async def final_score(self, state: Any) -> float: ...

    async def finish(self, state: Any) -> None: ...


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def last_number(text: str) -> float | None:
    """The last number written in ``text`` (commas as thousands separators), or None."""
    found = _NUMBER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


@dataclass(slots=True)
class _RetryState:
    truth: float
    attempts: int = 0
    solved: bool = False


class RetryOnWrongAnswer:
    """The example interaction: checks the last number of the model's answer against the ground truth; a wrong
    answer gets feedback and another try, up to ``max_attempts``."""

    def __init__(
        self, max_attempts: int = 2, feedback: str = "That is not correct. Check your work and try again."
    ) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        self.max_attempts = max_attempts
        self.feedback = feedback

    async def start(self, sample: Sample) -> _RetryState:
        if sample.ground_truth is None:
            raise ValueError(f"sample {sample.sample_id}: RetryOnWrongAnswer needs a ground_truth")
        return _RetryState(truth=float(sample.ground_truth.replace(",", "")))

    async def respond(self, state: _RetryState, messages: list[dict[str, Any]]) -> InteractionTurn:
        state.attempts += 1
        answer = last_number(messages[-1].get("content") or "")
        if answer is not None and abs(answer - state.truth) <= 1e-6 * max(1.0, abs(state.truth)):
            state.solved = True
            return InteractionTurn(done=True, content="Correct.", score=1.0)
        if state.attempts >= self.max_attempts:
            return InteractionTurn(done=True, content="", score=0.0)
        return InteractionTurn(done=False, content=self.feedback, score=0.0)

    async def final_score(self, state: _RetryState) -> float:
        return 1.0 if state.solved else 0.0

    async def finish(self, state: _RetryState) -> None:
        return None
