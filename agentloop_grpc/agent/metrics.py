"""RolloutMetrics: what a batch cost and how it went, computed once from its trajectories."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from .trajectory import Trajectory


@dataclass(frozen=True, slots=True)
class RolloutMetrics:
    trajectories: int
    failures: int
    infrastructure_failures: int
    #: Infrastructure failures by what failed (``Trajectory.infrastructure_cause``), most common first.
    infrastructure_causes: dict[str, int]
    wall_s: float
    mean_reward: float
    #: Share of the scorable (not failed) trajectories whose reward reached 1.0.
    correct_rate: float
    mean_assistant_turns: float
    model_tokens: int
    model_tokens_per_s: float
    tool_calls: int
    tool_errors: int
    malformed_tool_calls: int
    generate_s: float
    tools_s: float
    reward_s: float
    slowest_sample: str
    slowest_s: float
    resumed_generations: int
    terminations: dict[str, int]

    @classmethod
    def of(cls, trajectories: Sequence[Trajectory], wall_s: float) -> RolloutMetrics:
        ok = [t for t in trajectories if not t.failed]
        slowest = max(trajectories, key=lambda t: t.timings.total_s, default=None)
        tokens = sum(t.model_tokens for t in trajectories)
        terminations: dict[str, int] = {}
        for t in trajectories:
            terminations[t.termination.value] = terminations.get(t.termination.value, 0) + 1
        return cls(
            trajectories=len(trajectories),
            failures=len(trajectories) - len(ok),
            infrastructure_failures=sum(t.infrastructure_failure for t in trajectories),
            infrastructure_causes=infrastructure_causes(trajectories),
            wall_s=wall_s,
            mean_reward=statistics.fmean(t.reward for t in ok) if ok else 0.0,
            correct_rate=sum(t.reward >= 1.0 for t in ok) / len(ok) if ok else 0.0,
            mean_assistant_turns=statistics.fmean(t.assistant_turns for t in ok) if ok else 0.0,
            model_tokens=tokens,
            model_tokens_per_s=tokens / wall_s if wall_s > 0 else 0.0,
            tool_calls=sum(t.tool_calls for t in trajectories),
            tool_errors=sum(t.tool_errors for t in trajectories),
            malformed_tool_calls=sum(t.malformed_tool_calls for t in trajectories),
            generate_s=sum(t.timings.generate_s for t in trajectories),
            tools_s=sum(t.timings.tools_s for t in trajectories),
            reward_s=sum(t.timings.reward_s for t in trajectories),
            slowest_sample=slowest.sample_id if slowest else "",
            slowest_s=slowest.timings.total_s if slowest else 0.0,
            resumed_generations=sum(t.resumed_generations for t in trajectories),
            terminations=terminations,
        )

    @property
    def tool_call_attempts(self) -> int:
        """Calls the model wrote, well-formed or not."""
        return self.tool_calls + self.malformed_tool_calls

    @property
    def valid_tool_call_rate(self) -> float:
        """Share of the attempts that ran without a tool error."""
        attempts = self.tool_call_attempts
        return (attempts - self.tool_errors) / attempts if attempts else 0.0

    def as_dict(self) -> dict:
        return asdict(self)


def infrastructure_causes(trajectories: Sequence[Trajectory]) -> dict[str, int]:
    """Infrastructure failures by cause, most common first (``unspecified`` where none was recorded)."""
    counts = Counter(t.infrastructure_cause or "unspecified" for t in trajectories if t.infrastructure_failure)
    return dict(counts.most_common())
