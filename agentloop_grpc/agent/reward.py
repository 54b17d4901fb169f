"""Rewards inside the rollout: a reward function runs as soon as its trajectory ends, so scoring overlaps with
the trajectories still generating (no separate pass over the batch).

A reward function takes an ``Outcome`` and returns a float or a ``Score`` (reward plus metrics), sync or async.
Sync functions run in a thread so a slow scorer does not stall the event loop that drives the other loops.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from .sample import Sample
from .trajectory import Termination


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a reward function sees of a finished loop."""

    sample: Sample
    messages: tuple[dict[str, Any], ...]
    termination: Termination
    #: CalcReward of each tool instance the trajectory used, by tool name.
    tool_instance_rewards: dict[str, float]
    #: Step rewards of the calls, in order.
    tool_step_rewards: tuple[float, ...]
    #: The interaction's final score (None without an interaction).
    interaction_score: float | None
    response_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Score:
    reward: float
    metrics: dict[str, float] = field(default_factory=dict)


RewardFunction = Callable[[Outcome], float | Score | Awaitable[float | Score]]


def default_reward(outcome: Outcome) -> Score:
    """The sum of the tool instances' rewards (e.g. check_answer: 1.0 when correct) plus the interaction's final
    score."""
    tools = sum(outcome.tool_instance_rewards.values())
    interaction = outcome.interaction_score or 0.0
    return Score(tools + interaction, {"reward_tools": tools, "reward_interaction": interaction})


async def score(function: RewardFunction, outcome: Outcome) -> Score:
    if inspect.iscoroutinefunction(function):
        value = await function(outcome)
    else:
        value = await asyncio.to_thread(function, outcome)
        if inspect.isawaitable(value):
            value = await value
    return value if isinstance(value, Score) else Score(float(value))
