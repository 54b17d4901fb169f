"""TrajectoryBuilder: the mutable record a loop appends to while it runs, frozen into a Trajectory at the end.

Two kinds of appends and nothing else: ``model`` (the engine's tokens, logprobs and weight versions, verbatim) and
``context`` (tokens the loop encoded: tool responses, user turns, turn separators; mask 0). Keeping the kinds apart
is what makes the mask right by construction.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .trajectory import Drift, Termination, Timings, Trajectory


@dataclass(slots=True)
class TrajectoryBuilder:
    sample_id: str
    loop: str
    prompt_ids: list[int]
    group_id: str = ""
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    response_logprobs: list[float] = field(default_factory=list)
    weight_versions: list[int] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    assistant_turns: int = 0
    user_turns: int = 0
    turn_scores: list[float] = field(default_factory=list)
    tool_rewards: list[float] = field(default_factory=list)
    tool_calls: int = 0
    tool_errors: int = 0
    malformed_tool_calls: int = 0
    resumed_generations: int = 0
    servers: list[str] = field(default_factory=list)
    constrained: bool = False
    generate_s: float = 0.0
    tools_s: float = 0.0
    interaction_s: float = 0.0
    started_at: float = field(default_factory=time.time)
    started: float = field(default_factory=time.monotonic)

    @property
    def all_ids(self) -> list[int]:
        """Prompt plus response so far: the next generation's prompt."""
        return self.prompt_ids + self.response_ids

    def model(self, token_ids: Sequence[int], logprobs: Sequence[float], versions: Sequence[int]) -> None:
        """Append tokens the engine produced, exactly as produced."""
        if not (len(token_ids) == len(versions) and len(logprobs) in (0, len(token_ids))):
            raise ValueError(
                f"engine output is misaligned: {len(token_ids)} tokens, {len(logprobs)} logprobs, "
                f"{len(versions)} versions"
            )
        self.response_ids += token_ids
        self.response_mask += [1] * len(token_ids)
        self.response_logprobs += logprobs if logprobs else [0.0] * len(token_ids)
        self.weight_versions += versions

    def context(self, token_ids: Sequence[int]) -> None:
        """Append tokens the loop encoded (tool/user turns, template separators): not trained on."""
        self.response_ids += token_ids
        self.response_mask += [0] * len(token_ids)
        self.response_logprobs += [0.0] * len(token_ids)
        self.weight_versions += [-1] * len(token_ids)

    def served_by(self, servers: Sequence[str]) -> None:
        for server in servers:
            if server not in self.servers:
                self.servers.append(server)

    def build(
        self,
        termination: Termination,
        reward: float = 0.0,
        reward_s: float = 0.0,
        error: str | None = None,
        infrastructure_failure: bool = False,
        drift: Drift | None = None,
        metrics: dict[str, float] | None = None,
    ) -> Trajectory:
        return Trajectory(
            sample_id=self.sample_id,
            loop=self.loop,
            group_id=self.group_id,
            prompt_ids=tuple(self.prompt_ids),
            response_ids=tuple(self.response_ids),
            response_mask=tuple(self.response_mask),
            response_logprobs=tuple(self.response_logprobs),
            weight_versions=tuple(self.weight_versions),
            reward=reward,
            termination=termination,
            assistant_turns=self.assistant_turns,
            user_turns=self.user_turns,
            turn_scores=tuple(self.turn_scores),
            tool_rewards=tuple(self.tool_rewards),
            tool_calls=self.tool_calls,
            tool_errors=self.tool_errors,
            malformed_tool_calls=self.malformed_tool_calls,
            constrained=self.constrained,
            infrastructure_failure=infrastructure_failure,
            error=error,
            drift=drift,
            resumed_generations=self.resumed_generations,
            timings=Timings(
                generate_s=self.generate_s,
                tools_s=self.tools_s,
                interaction_s=self.interaction_s,
                reward_s=reward_s,
                total_s=time.monotonic() - self.started,
                started_at=self.started_at,
            ),
            servers=tuple(self.servers),
            messages=tuple(self.messages),
            metrics=dict(metrics or {}),
        )
